"""The local Kubernetes control plane: real kube-apiserver, controller-manager, scheduler and
etcd started by kwokctl, with KWOK playing kubelet for fake Blackwell GPU nodes."""
