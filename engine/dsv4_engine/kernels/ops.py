"""Backend selection: one named set of kernel functions, so callers never branch on it."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dsv4_engine.kernels import index_k_ref, indexer_ref, paged_copy_ref

BACKEND_ENV = "DSV4_KERNEL_BACKEND"
BACKENDS = ("torch", "triton")


@dataclass(frozen=True)
class KernelOps:
    backend: str
    store_index_k: Callable[..., None]
    read_index_k: Callable[..., torch.Tensor]
    index_scores: Callable[..., torch.Tensor]
    copy_pages: Callable[..., torch.Tensor | None]
    page_checksums: Callable[..., torch.Tensor]


def default_backend(device: torch.device | str) -> str:
    """$DSV4_KERNEL_BACKEND if set, else triton on CUDA and torch elsewhere."""
    forced = os.environ.get(BACKEND_ENV)
    if forced:
        if forced not in BACKENDS:
            raise ValueError(f"{BACKEND_ENV}={forced!r}: expected one of {', '.join(BACKENDS)}")
        return forced
    return "triton" if torch.device(device).type == "cuda" else "torch"


def get_ops(backend: str) -> KernelOps:
    if backend == "torch":
        return KernelOps(
            "torch",
            index_k_ref.store_index_k,
            index_k_ref.read_index_k,
            indexer_ref.index_scores,
            paged_copy_ref.copy_pages,
            paged_copy_ref.page_checksums,
        )
    if backend == "triton":
        # Imported here: importing triton decides interpreter vs compiled at decoration time.
        from dsv4_engine.kernels import index_k_triton, paged_copy_triton

        return KernelOps(
            "triton",
            index_k_triton.store_index_k,
            index_k_triton.read_index_k,
            index_k_triton.index_scores,
            paged_copy_triton.copy_pages,
            paged_copy_triton.page_checksums,
        )
    raise ValueError(f"kernel backend {backend!r}: expected one of {', '.join(BACKENDS)}")
