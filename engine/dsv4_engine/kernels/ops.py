"""Backend selection: one named set of kernel functions, so callers never branch on it."""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch

from dsv4_engine.kernels import index_k_ref, indexer_ref, paged_copy_ref

BACKEND_ENV = "DSV4_KERNEL_BACKEND"
BACKENDS = ("torch", "triton")
INTERPRET_ENV = "TRITON_INTERPRET"
# Triton's interpreter patches `triton.language` module-wide for the length of a launch, so
# two threads interpreting at once corrupt each other; compiled kernels need no lock.
_INTERPRETER_LOCK = threading.Lock()


@dataclass(frozen=True)
class KernelOps:
    backend: str
    store_index_k: Callable[..., None]
    read_index_k: Callable[..., torch.Tensor]
    index_scores: Callable[..., torch.Tensor]
    topk: Callable[[torch.Tensor, int], torch.Tensor]
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
            indexer_ref.topk,
            paged_copy_ref.copy_pages,
            paged_copy_ref.page_checksums,
        )
    if backend == "triton":
        # Imported here: importing triton decides interpreter vs compiled at decoration time.
        from dsv4_engine.kernels import index_k_triton, paged_copy_triton, topk_triton

        ops = KernelOps(
            "triton",
            index_k_triton.store_index_k,
            index_k_triton.read_index_k,
            index_k_triton.index_scores,
            topk_triton.topk,
            paged_copy_triton.copy_pages,
            paged_copy_triton.page_checksums,
        )
        return _one_thread_at_a_time(ops) if os.environ.get(INTERPRET_ENV) == "1" else ops
    raise ValueError(f"kernel backend {backend!r}: expected one of {', '.join(BACKENDS)}")


def _one_thread_at_a_time(ops: KernelOps) -> KernelOps:
    """`ops` with every call holding the interpreter lock (TRITON_INTERPRET=1 only)."""

    def locked(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            with _INTERPRETER_LOCK:
                return fn(*args, **kwargs)

        return call

    return KernelOps(
        ops.backend, *(locked(getattr(ops, f.name)) for f in fields(ops) if f.name != "backend")
    )
