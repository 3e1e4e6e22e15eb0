"""The CPU reference engine: a tiny DeepSeek-V4-shaped model served over the OpenAI API.

It runs on the project's real pools, HiCache host tier, per-layer gate and kernels, so
the corruption a bug causes there is the corruption served to a client.  Modules:
`tokenizer` and `chat` (prompt in), `model` (forward pass over paged pools), `radix`
(prefix cache over pages, evicting to the host tier), `engine` (the scheduler thread),
`server` (HTTP), `pd` (prefill → decode page transfer over TCP), `router` (PD router).
"""
