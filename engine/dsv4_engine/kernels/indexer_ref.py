"""Lightning-indexer scoring and top-k: the plain torch reference.

score(t, s) = Σ_h w[t, h] · ReLU(q[t, h] · k[s]) for each query token t over a request's
compressed entries s; attention then reads only the top-k entries of each token, which is
why one stale key can change what it reads.
"""

from __future__ import annotations

import torch

from dsv4_engine.index_k import IndexKeyFormat
from dsv4_engine.kernels import index_k_ref


def indexer_scores(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """q [T, H, d], w [T, H], keys [n, d] (float) -> scores [T, n] float32."""
    tokens, heads, dim = q.shape
    logits = (q.reshape(tokens * heads, dim).to(torch.float32) @ keys.to(torch.float32).T).view(
        tokens, heads, -1
    )
    return (torch.relu(logits) * w.to(torch.float32)[..., None]).sum(1)


def index_scores(
    buf: torch.Tensor,
    locs: torch.Tensor,
    fmt: IndexKeyFormat,
    entries: int,
    q: torch.Tensor,
    w: torch.Tensor,
) -> torch.Tensor:
    """Scores [T, n] of paged entries `locs`: read (dequantize) the keys, then score them.

    The reference of the fused Triton kernel, and its fallback where it has no kernel.
    """
    return indexer_scores(q, w, index_k_ref.read_index_k(buf, locs, fmt, entries))


def topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices [T, k] of each row's k best scores, best first; ties go to the lower index
    (a stable descending sort's first k, so every backend picks the same set).  Needs k <= n.

    Each score becomes one unique int64 key, so `torch.topk` (O(n), unlike a full sort) has
    no ties to break: the float's bits mapped to an order-preserving int32 in the high half
    (-0.0 folded into 0.0 first), the bit-inverted index in the low half.
    """
    n = scores.shape[-1]
    if k > n:
        raise ValueError(f"top-k: k={k} exceeds the {n} scores of a row")
    bits = (scores.to(torch.float32) + 0.0).view(torch.int32)  # + 0.0: -0.0 becomes 0.0
    ordered = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(torch.int64)
    low = (1 << 32) - 1 - torch.arange(n, device=scores.device)
    return torch.topk(ordered * (1 << 32) + low, k, dim=-1).indices
