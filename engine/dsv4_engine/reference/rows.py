"""Batch-invariant row ops: what the random model's batched decode computes with.

A decode step batches one token of every running request, yet a request's answer must not
depend on the rest of its batch (the consistency probe compares answers across batches).
A plain `[B, h] @ [h, d]` does not give that on CPU: the BLAS picks its kernel (and so the
rounding of every row) by the batch's shape, and a row computed with B = 1 differs from the
same row inside B = 8 (on this project's CPUs every row did).  So every op here computes each row on shapes of its own:

* a projection is one small GEMM per row (`torch.bmm` over the rows, the weight expanded,
  not copied): the same `[1, h] @ [h, d]` whatever B is;
* attention runs over context widths that are a property of the row, never the batch's
  longest row: a softmax or a dot product over a row padded to another width may round
  differently.

Elementwise ops and reductions along a row's last dimension are row-invariant as they are.
`tests/unit/reference/test_rows.py` checks that a row's projection and attention, and a
whole decode's pool bytes, are the same in any batch.
"""

from __future__ import annotations

import math

import torch


def project(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [B, h] @ w [h, d] -> [B, d], each row as its own one-row GEMM."""
    rows = x.shape[0]
    return torch.bmm(x[:, None, :], w.expand(rows, *w.shape))[:, 0]


def attend(q: torch.Tensor, parts: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Attention of one query per row, q [B, d], over context parts (keys = values):
    each part is (ctx [B, C, d], visible [B, C]); hidden entries weigh exactly 0, and must
    hold finite values (0 * NaN would still poison the row)."""
    qs = q[:, None, :]
    scores = [torch.bmm(qs, ctx.transpose(1, 2))[:, 0] for ctx, _ in parts]
    out = torch.zeros_like(q)
    for (ctx, _), p in zip(parts, joint_softmax(scores, parts, q.shape[1]), strict=True):
        out = out + torch.bmm(p[:, None, :], ctx)[:, 0]
    return out


def joint_softmax(
    scores: list[torch.Tensor], parts: list[tuple[torch.Tensor, torch.Tensor]], dim: int
) -> list[torch.Tensor]:
    """Attention weights over several context parts at once: each part's raw scores [N, C]
    scaled by 1/sqrt(dim), its hidden entries (`parts`' visible masks) at -inf, one softmax
    across every part, split back into the parts' widths."""
    scale = 1 / math.sqrt(dim)
    masked = [
        (s * scale).masked_fill(~visible, float("-inf"))
        for s, (_, visible) in zip(scores, parts, strict=True)
    ]
    probs = torch.softmax(torch.cat(masked, dim=1), dim=1)
    return list(probs.split([s.shape[1] for s in scores], dim=1))
