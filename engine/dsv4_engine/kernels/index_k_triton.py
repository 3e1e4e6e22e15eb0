"""Index-K store, read and indexer scoring as Triton kernels (references: index_k_ref.py,
indexer_ref.py).

Same byte layout as the reference, so either can write what the other reads.  fp8 and bf16
have kernels; fp4 (MXFP4) runs the torch reference on every backend.  Stores must match the
reference bit for bit (a page written by one backend is read by the other), so the kernels
divide with `div_rn` and round float32 to bf16 / e4m3 with explicit round-to-nearest-even
bit arithmetic instead of `.to()`: Triton 3.8's interpreter truncates float32 -> bf16 and
drops the carry when float32 -> float8e4nv rounds up into the next binade (124.3 -> 64).
"""

# Triton reads kernel parameter annotations (tl.constexpr marks compile-time constants);
# tensor and scalar parameters must stay unannotated.
# ruff: noqa: ANN001, ANN201, ANN202

import torch
import triton
import triton.language as tl

from dsv4_engine.features import IndexDtype
from dsv4_engine.index_k import FP8_BLOCK, IndexKeyFormat
from dsv4_engine.kernels import index_k_ref, indexer_ref

BLOCK_N = 64  # entries per program of the store, read and score kernels
SCORE_ROWS = 256  # (token, head) query rows per program of the score kernel
# Warps of a store or read program: at 4, a block of 64 fp8 keys of 128 dims needs more than
# the 255 registers a thread has and spills (`kernels.targets` compiles and checks it).
STORE_READ_WARPS = 8
MIN_DOT = 16  # tl.dot needs every dimension >= 16 and a power of two


@triton.jit
def _load_block_keys(
    buf_u8, buf_f32, buf_bf16, page_ptr, slot_ptr, n, page_bytes, entries,
    D: tl.constexpr, NB: tl.constexpr, IS_FP8: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """This program's block of entries: (rows, mask, dequantized keys [BLOCK_N, D] float32)."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = rows < n
    page = tl.load(page_ptr + rows, mask=mask, other=0)
    slot = tl.load(slot_ptr + rows, mask=mask, other=0)
    cols = tl.arange(0, D)
    if IS_FP8:
        offs = page[:, None] * page_bytes + slot[:, None] * D + cols[None, :]
        raw = tl.load(buf_u8 + offs, mask=mask[:, None], other=0)
        q = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        scale_offs = (page * page_bytes + entries * D + slot * NB * 4) // 4
        scales = tl.load(
            buf_f32 + scale_offs[:, None] + tl.arange(0, NB)[None, :], mask=mask[:, None], other=0
        )
        keys = tl.reshape(tl.reshape(q, (BLOCK_N, NB, D // NB)) * scales[:, :, None], (BLOCK_N, D))
    else:
        offs = (page[:, None] * page_bytes) // 2 + slot[:, None] * D + cols[None, :]
        keys = tl.load(buf_bf16 + offs, mask=mask[:, None], other=0).to(tl.float32)
    return rows, mask, keys


@triton.jit
def _bf16_bits(x):
    """float32 -> bf16 bit pattern, round to nearest even (finite inputs)."""
    bits = x.to(tl.uint32, bitcast=True)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).to(tl.uint16).to(tl.int16, bitcast=True)


@triton.jit
def _e4m3_bits(v):
    """float32 (|v| <= 448) -> float8 e4m3fn bit pattern, round to nearest even."""
    sign = ((v.to(tl.uint32, bitcast=True) >> 24) & 0x80).to(tl.int32)
    a = tl.abs(v)
    bits = a.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000  # 3 mantissa bits, RNE
    normal = (((rounded >> 23).to(tl.int32) - 120) << 3) | ((rounded >> 20) & 7).to(tl.int32)
    # Below 2^-6 steps are 2^-9: code = rint(a * 512) (1.5 * 2^23 makes the add round).
    subnormal = ((a * 512.0 + 12582912.0) - 12582912.0).to(tl.int32)
    return (tl.where(a < 0.015625, subnormal, normal) | sign).to(tl.uint8)


@triton.jit
def store_kernel(
    keys_ptr, buf_u8, buf_f32, buf_i16, page_ptr, slot_ptr, n, page_bytes, entries,
    D: tl.constexpr, NB: tl.constexpr, IS_FP8: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = rows < n
    page = tl.load(page_ptr + rows, mask=mask, other=0)
    slot = tl.load(slot_ptr + rows, mask=mask, other=0)
    cols = tl.arange(0, D)
    x = tl.load(keys_ptr + rows[:, None] * D + cols[None, :], mask=mask[:, None], other=0.0)
    x = x.to(tl.float32)
    if IS_FP8:
        blocks = tl.reshape(x, (BLOCK_N, NB, D // NB))
        scale = tl.math.div_rn(tl.maximum(tl.max(tl.abs(blocks), axis=2), 1e-12), 448.0)
        codes = _e4m3_bits(tl.math.div_rn(blocks, scale[:, :, None]))
        key_offs = page[:, None] * page_bytes + slot[:, None] * D + cols[None, :]
        tl.store(buf_u8 + key_offs, tl.reshape(codes, (BLOCK_N, D)), mask=mask[:, None])
        scale_offs = (page * page_bytes + entries * D + slot * NB * 4) // 4
        scale_ptrs = buf_f32 + scale_offs[:, None] + tl.arange(0, NB)[None, :]
        tl.store(scale_ptrs, scale, mask=mask[:, None])
    else:
        offs = (page[:, None] * page_bytes) // 2 + slot[:, None] * D + cols[None, :]
        tl.store(buf_i16 + offs, _bf16_bits(x), mask=mask[:, None])


@triton.jit
def read_kernel(
    buf_u8, buf_f32, buf_bf16, page_ptr, slot_ptr, out_ptr, n, page_bytes, entries,
    D: tl.constexpr, NB: tl.constexpr, IS_FP8: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    rows, mask, keys = _load_block_keys(
        buf_u8, buf_f32, buf_bf16, page_ptr, slot_ptr, n, page_bytes, entries, D, NB, IS_FP8, BLOCK_N
    )  # fmt: skip
    tl.store(out_ptr + rows[:, None] * D + tl.arange(0, D)[None, :], keys, mask=mask[:, None])


@triton.jit
def score_kernel(
    buf_u8, buf_f32, buf_bf16, page_ptr, slot_ptr, q_ptr, w_ptr, out_ptr, n, tokens, heads,
    block_t, page_bytes, entries, D: tl.constexpr, NB: tl.constexpr, IS_FP8: tl.constexpr,
    BLOCK_N: tl.constexpr, RP: tl.constexpr, TP: tl.constexpr,
):  # fmt: skip
    """A block of entries, dequantized once, scored for `block_t` query tokens at once.

    The tokens' (token, head) query rows are one [RP, D] matrix (rows past the real ones are
    zero queries with zero weights, adding exactly 0), so any head count takes this kernel;
    a 0/1 matrix then sums each token's heads with a second dot.
    """
    rows, mask, keys = _load_block_keys(
        buf_u8, buf_f32, buf_bf16, page_ptr, slot_ptr, n, page_bytes, entries, D, NB, IS_FP8, BLOCK_N
    )  # fmt: skip
    first = tl.program_id(1) * block_t
    r = tl.arange(0, RP)
    qrow = first * heads + r
    live = (r < block_t * heads) & (qrow < tokens * heads)
    q = tl.load(q_ptr + qrow[:, None] * D + tl.arange(0, D)[None, :], mask=live[:, None], other=0.0)
    w = tl.load(w_ptr + qrow, mask=live, other=0.0)
    logits = tl.dot(q, tl.trans(keys), input_precision="ieee")
    weighted = tl.maximum(logits, 0.0) * w[:, None]
    t = tl.arange(0, TP)
    heads_of = ((r[None, :] // heads) == t[:, None]).to(tl.float32)
    scores = tl.dot(heads_of, weighted, input_precision="ieee")
    token = first + t
    out_mask = ((t < block_t) & (token < tokens))[:, None] & mask[None, :]
    tl.store(out_ptr + token[:, None] * n + rows[None, :], scores, mask=out_mask)


def _views(buf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    flat = buf.view(-1)
    return flat, flat.view(torch.float32), flat.view(torch.bfloat16)


def _page_slot(
    buf: torch.Tensor, locs: torch.Tensor, entries: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Checks `buf` (the kernels index it flat) and splits `locs` into page and slot."""
    if not buf.is_contiguous() or buf.dtype != torch.uint8:
        raise ValueError("index-K buffer: expected a contiguous uint8 [pages, page_bytes] tensor")
    page, slot = index_k_ref.page_slot(locs, entries)
    return page.contiguous(), slot.contiguous()


def dot_size(rows: int) -> int:
    return max(MIN_DOT, triton.next_power_of_2(rows))


def format_constants(fmt: IndexKeyFormat) -> dict[str, int | bool]:
    """The compile-time description of `fmt` every kernel takes (NB >= 1: tl.arange needs it)."""
    return {
        "D": fmt.head_dim,
        "NB": max(1, fmt.head_dim // FP8_BLOCK),
        "IS_FP8": fmt.dtype is IndexDtype.FP8,
    }


def store_index_k(
    buf: torch.Tensor, locs: torch.Tensor, keys: torch.Tensor, fmt: IndexKeyFormat, entries: int
) -> None:
    if fmt.dtype is IndexDtype.FP4:
        index_k_ref.store_index_k(buf, locs, keys, fmt, entries)
        return
    page, slot = _page_slot(buf, locs, entries)
    if page.numel() == 0:
        return
    u8, f32, _ = _views(buf)
    n = page.numel()
    store_kernel[(triton.cdiv(n, BLOCK_N),)](
        keys.to(torch.float32).contiguous(), u8, f32, u8.view(torch.int16), page, slot, n,
        buf.shape[1], entries, **format_constants(fmt), BLOCK_N=BLOCK_N,
        num_warps=STORE_READ_WARPS,
    )  # fmt: skip


def read_index_k(
    buf: torch.Tensor, locs: torch.Tensor, fmt: IndexKeyFormat, entries: int
) -> torch.Tensor:
    if fmt.dtype is IndexDtype.FP4:
        return index_k_ref.read_index_k(buf, locs, fmt, entries)
    page, slot = _page_slot(buf, locs, entries)
    n = page.numel()
    out = torch.empty((n, fmt.head_dim), dtype=torch.float32, device=buf.device)
    if n:
        u8, f32, bf16 = _views(buf)
        read_kernel[(triton.cdiv(n, BLOCK_N),)](
            u8, f32, bf16, page, slot, out, n, buf.shape[1], entries,
            **format_constants(fmt), BLOCK_N=BLOCK_N, num_warps=STORE_READ_WARPS,
        )  # fmt: skip
    return out


def index_scores(
    buf: torch.Tensor,
    locs: torch.Tensor,
    fmt: IndexKeyFormat,
    entries: int,
    q: torch.Tensor,
    w: torch.Tensor,
) -> torch.Tensor:
    """Scores [T, n]: Σ_h w[t,h]·ReLU(q[t,h]·k) of each entry for q [T, H, d], w [T, H],
    reading (and dequantizing) keys straight from pages."""
    if fmt.dtype is IndexDtype.FP4:
        return indexer_ref.index_scores(buf, locs, fmt, entries, q, w)
    tokens, heads, _ = q.shape
    page, slot = _page_slot(buf, locs, entries)
    n = page.numel()
    out = torch.empty((tokens, n), dtype=torch.float32, device=buf.device)
    if n and tokens:
        u8, f32, bf16 = _views(buf)
        block_t = min(tokens, max(1, SCORE_ROWS // heads))
        grid = (triton.cdiv(n, BLOCK_N), triton.cdiv(tokens, block_t))
        score_kernel[grid](
            u8, f32, bf16, page, slot, q.to(torch.float32).contiguous(),
            w.to(torch.float32).contiguous(), out, n, tokens, heads, block_t, buf.shape[1],
            entries, **format_constants(fmt), BLOCK_N=BLOCK_N,
            RP=dot_size(block_t * heads), TP=dot_size(block_t),
        )  # fmt: skip
    return out
