"""Kernels of the DSV4 pools, each a Triton kernel beside a plain torch reference.

`get_ops(backend)` picks one set: "torch" (the default on CPU) or "triton" (the default on
CUDA; on CPU only under TRITON_INTERPRET=1, for correctness, never for speed).
"""

from dsv4_engine.kernels.ops import KernelOps, default_backend, get_ops

__all__ = ["KernelOps", "default_backend", "get_ops"]
