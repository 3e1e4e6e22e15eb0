"""Lightning-indexer scoring and top-k: the plain torch reference.

score(s) = Σ_h w[h] · ReLU(q[h] · k[s]) over a request's compressed entries s; attention
then reads only the top-k entries, which is why one stale key can change what it reads.
"""

from __future__ import annotations

import torch

from dsv4_engine.index_k import IndexKeyFormat
from dsv4_engine.kernels import index_k_ref


def indexer_scores(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """q [H, d], w [H], keys [n, d] (float) -> scores [n] float32."""
    logits = q.to(torch.float32) @ keys.to(torch.float32).T
    return (torch.relu(logits) * w.to(torch.float32)[:, None]).sum(0)


def index_scores(
    buf: torch.Tensor,
    locs: torch.Tensor,
    fmt: IndexKeyFormat,
    entries: int,
    q: torch.Tensor,
    w: torch.Tensor,
) -> torch.Tensor:
    """Scores of paged entries `locs`: read (dequantize) the keys, then score them.

    The reference of the fused Triton kernel, and its fallback where it has no kernel.
    """
    return indexer_scores(q, w, index_k_ref.read_index_k(buf, locs, fmt, entries))


def topk_entries(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k best scores, best first; ties go to the lower index (deterministic)."""
    order = torch.sort(scores, descending=True, stable=True).indices
    return order[: min(k, scores.numel())]
