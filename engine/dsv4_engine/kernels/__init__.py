"""Kernels of the DSV4 pools, each a Triton kernel beside the plain torch reference the
tests hold it to: index-K store / read / indexer scores (`index_k_triton`, references
`index_k_ref`, `indexer_ref`; fp4 index-K runs the reference on every backend), the
indexer's top-k (`topk_triton`, reference `indexer_ref.topk`) and the paged copy with
checksums (`paged_copy_triton`, reference `paged_copy_ref`).

`get_ops(backend)` picks one set: "torch" (the default on CPU) or "triton" (the default on
CUDA; on CPU only under TRITON_INTERPRET=1, for correctness, never for speed).  The pools,
the HiCache transfer controller and the reference model call kernels only through it.
"""

from dsv4_engine.kernels.ops import KernelOps, default_backend, get_ops

__all__ = ["KernelOps", "default_backend", "get_ops"]
