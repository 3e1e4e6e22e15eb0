"""The local embedded runtime: plays kubelet for engine and router pods on KWOK nodes."""
