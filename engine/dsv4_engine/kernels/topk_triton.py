"""The lightning indexer's top-k as a Triton kernel (reference: indexer_ref.topk).

Each score becomes one 64-bit key that sorts like the reference: the float's bits mapped to
an order-preserving unsigned integer in the high half, the bit-inverted entry index in the
low half, so a larger score wins and, between equal scores, the lower index (a stable
descending sort).  -0.0 is folded into 0.0 first (they are equal to the reference too).

Keys are unique (the index is part of each), so selection is exact: a program takes the
largest key of its chunk k times, zeroing each one taken.  A long row is cut into chunks
whose top-k candidates are reduced again, chunk by chunk, until one chunk is left, whose
keys decode to the indices (their low halves).  Any row length, any k <= n.
"""

# Triton reads kernel parameter annotations (tl.constexpr marks compile-time constants);
# tensor and scalar parameters must stay unannotated.
# ruff: noqa: ANN001, ANN201, ANN202

import torch
import triton
import triton.language as tl

MAX_CHUNK = 4096  # keys one program selects from, unless 2k needs more (a power of two)
BLOCK_KEYS = 8192  # keys of one program: rows per program = this / chunk (at least 1)


@triton.jit
def topk_kernel(
    in_ptr, out_ptr, rows, n, in_stride, out_stride, k,
    CHUNK: tl.constexpr, BLOCK_R: tl.constexpr, FROM_SCORES: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    chunk = tl.program_id(0)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    live = row < rows
    mask = live[:, None] & (offs[None, :] < n)
    ptrs = in_ptr + row[:, None] * in_stride + offs[None, :]
    if FROM_SCORES:
        score = tl.load(ptrs, mask=mask, other=0.0)
        bits = tl.where(score == 0.0, 0.0, score).to(tl.uint32, bitcast=True)
        ordered = tl.where((bits >> 31) != 0, bits ^ 0xFFFFFFFF, bits | 0x80000000)
        low = offs.to(tl.uint32) ^ 0xFFFFFFFF
        key = (ordered.to(tl.uint64) << 32) | low.to(tl.uint64)[None, :]
        key = tl.where(mask, key, 0)  # padding sorts below every score, -inf included
    else:
        key = tl.load(ptrs, mask=mask, other=0).to(tl.uint64, bitcast=True)
    out = out_ptr + row * out_stride + chunk * k
    for i in range(0, k):
        best = tl.max(key, axis=1)
        tl.store(out + i, best.to(tl.int64, bitcast=True), mask=live)
        key = tl.where(key == best[:, None], 0, key)


def chunking(rows: int, n: int, k: int) -> tuple[int, int]:
    """(keys per chunk, rows per program) for ``rows`` rows of ``n`` scores and top-``k``:
    a whole row while it fits `MAX_CHUNK`, else chunks that each keep 2k candidates."""
    width = triton.next_power_of_2(n)
    chunk = width if width <= MAX_CHUNK else max(MAX_CHUNK, 2 * triton.next_power_of_2(k))
    return chunk, min(triton.next_power_of_2(rows), max(1, BLOCK_KEYS // chunk))


def topk(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices [T, k] of each row's k best scores, best first, ties to the lower index."""
    rows, n = scores.shape
    if k > n:
        raise ValueError(f"top-k: k={k} exceeds the {n} scores of a row")
    if k == 0 or rows == 0:
        return torch.empty((rows, k), dtype=torch.int64, device=scores.device)
    chunk, block_r = chunking(rows, n, k)
    current = scores.to(torch.float32).contiguous()
    from_scores = True
    while True:
        last = current.shape[1] <= chunk
        chunks = triton.cdiv(current.shape[1], chunk)
        # Each chunk keeps k candidates; a chunk shorter than k keeps zero keys past its
        # end, which sort below every real key.
        out = torch.empty((rows, chunks * k), dtype=torch.int64, device=scores.device)
        topk_kernel[(chunks, triton.cdiv(rows, block_r))](
            current, out, rows, current.shape[1], current.stride(0), out.stride(0), k,
            CHUNK=chunk, BLOCK_R=block_r, FROM_SCORES=from_scores,
        )  # fmt: skip
        if last:  # the entry index is the bit-inverted low half of each key
            return (out & 0xFFFFFFFF) ^ 0xFFFFFFFF
        current, from_scores = out, False
