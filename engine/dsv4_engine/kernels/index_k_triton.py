"""Index-K store, read and indexer scoring as Triton kernels (references: index_k_ref.py,
indexer_ref.py).

Same byte layout as the reference, so either can write what the other reads.  fp8 and bf16
have kernels; fp4 (MXFP4) runs the torch reference on every backend.  Stores must match the
reference bit for bit (a page written by one backend is read by the other), so the kernels
divide with `div_rn` and round float32 to bf16 / e4m3 with explicit round-to-nearest-even
bit arithmetic instead of `.to()`: Triton 3.8's interpreter truncates float32 -> bf16 and
drops the carry when float32 -> float8e4nv rounds up into the next binade (124.3 -> 64).
Scores multiply on tensor cores (bf16 dots, fp32 accumulation; `score_kernel`) and come
within `SCORE_TOLERANCE` of the reference.
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

BLOCK_N = 64  # entries per program of the store and read kernels, per loop step of the score
# Warps of a store or read program: at 4, a block of 64 fp8 keys of 128 dims needs more than
# the 255 registers a thread has and spills (`kernels.targets` compiles and checks it).
STORE_READ_WARPS = 8
# Entry blocks one score program walks with its queries loaded once: q is read once per
# SCORE_BLOCKS * BLOCK_N entries instead of once per block.
SCORE_BLOCKS = 8
SCORE_WARPS = 4  # one warpgroup: SCORE_ROWS query rows are one wgmma tile (m64) on sm90
MIN_DOT = 16  # tl.dot needs every dimension >= 16 and a power of two
# How far the score kernel may land from the fp32 reference (torch.allclose's arguments).
# Its dots take bf16 inputs: the keys exactly, but q as hi + lo (`split_bf16`), off by up to
# 2^-16 of |q| where fp32 rounds at 2^-24, so the fp32 dot's 1e-5/1e-4 became
# 1e-4/1e-3.  Measured on the interpreter tests' scores (|score| up to ~150): a sixth of
# that at most.  Still tight: one key's scale off by 0.1%, or another token's q, lands
# far outside (test_kernels checks both).
SCORE_TOLERANCE = {"rtol": 1e-4, "atol": 1e-3}


@triton.jit
def _block_entries(page_ptr, slot_ptr, start, n, BLOCK_N: tl.constexpr):
    """(rows, mask, page, slot) of the BLOCK_N entries from `start`."""
    rows = start + tl.arange(0, BLOCK_N)
    mask = rows < n
    page = tl.load(page_ptr + rows, mask=mask, other=0)
    slot = tl.load(slot_ptr + rows, mask=mask, other=0)
    return rows, mask, page, slot


@triton.jit
def _stored_keys(
    buf_u8, buf_bf16, page, slot, mask, page_bytes, D: tl.constexpr, IS_FP8: tl.constexpr
):  # fmt: skip
    """The entries' keys as stored, unscaled: e4m3 codes (fp8) or bf16 values [BLOCK_N, D]."""
    cols = tl.arange(0, D)
    if IS_FP8:
        offs = page[:, None] * page_bytes + slot[:, None] * D + cols[None, :]
        raw = tl.load(buf_u8 + offs, mask=mask[:, None], other=0)
        keys = raw.to(tl.float8e4nv, bitcast=True)
    else:
        offs = (page[:, None] * page_bytes) // 2 + slot[:, None] * D + cols[None, :]
        keys = tl.load(buf_bf16 + offs, mask=mask[:, None], other=0)
    return keys


@triton.jit
def _scale_offsets(page, slot, page_bytes, entries, D: tl.constexpr, NB: tl.constexpr):
    """float32 offsets [BLOCK_N, NB] of the fp8 entries' scales, one per FP8_BLOCK elements,
    in the page's scale region after all its keys."""
    offs = (page * page_bytes + entries * D + slot * NB * 4) // 4
    return offs[:, None] + tl.arange(0, NB)[None, :]


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
    rows, mask, page, slot = _block_entries(
        page_ptr, slot_ptr, tl.program_id(0) * BLOCK_N, n, BLOCK_N
    )
    cols = tl.arange(0, D)
    x = tl.load(keys_ptr + rows[:, None] * D + cols[None, :], mask=mask[:, None], other=0.0)
    x = x.to(tl.float32)
    if IS_FP8:
        blocks = tl.reshape(x, (BLOCK_N, NB, D // NB))
        scale = tl.math.div_rn(tl.maximum(tl.max(tl.abs(blocks), axis=2), 1e-12), 448.0)
        codes = _e4m3_bits(tl.math.div_rn(blocks, scale[:, :, None]))
        key_offs = page[:, None] * page_bytes + slot[:, None] * D + cols[None, :]
        tl.store(buf_u8 + key_offs, tl.reshape(codes, (BLOCK_N, D)), mask=mask[:, None])
        scale_offs = _scale_offsets(page, slot, page_bytes, entries, D, NB)
        tl.store(buf_f32 + scale_offs, scale, mask=mask[:, None])
    else:
        offs = (page[:, None] * page_bytes) // 2 + slot[:, None] * D + cols[None, :]
        tl.store(buf_i16 + offs, _bf16_bits(x), mask=mask[:, None])


@triton.jit
def read_kernel(
    buf_u8, buf_f32, buf_bf16, page_ptr, slot_ptr, out_ptr, n, page_bytes, entries,
    D: tl.constexpr, NB: tl.constexpr, IS_FP8: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    rows, mask, page, slot = _block_entries(
        page_ptr, slot_ptr, tl.program_id(0) * BLOCK_N, n, BLOCK_N
    )
    keys = _stored_keys(buf_u8, buf_bf16, page, slot, mask, page_bytes, D, IS_FP8).to(tl.float32)
    if IS_FP8:
        scales = tl.load(
            buf_f32 + _scale_offsets(page, slot, page_bytes, entries, D, NB),
            mask=mask[:, None],
            other=0.0,
        )
        keys = tl.reshape(
            tl.reshape(keys, (BLOCK_N, NB, D // NB)) * scales[:, :, None], (BLOCK_N, D)
        )
    tl.store(out_ptr + rows[:, None] * D + tl.arange(0, D)[None, :], keys, mask=mask[:, None])


@triton.jit
def _logits(
    q_hi, q_lo, buf_u8, buf_f32, buf_bf16, page, slot, mask, page_bytes, entries,
    D: tl.constexpr, NB: tl.constexpr, IS_FP8: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """q · k [HP, BLOCK_N] in float32 from bf16 tensor-core dots, fp32 accumulation.

    Exact inputs: a stored key is exact in bf16 (bf16 values, or e4m3 codes, whose 3-bit
    mantissas and exponents bf16 holds), and q arrives as two bf16 halves (`split_bf16`),
    so every product is exact and only q's residual below 2^-16 of |q| is lost.  An fp8
    key's scale multiplies the dot of its own FP8_BLOCK elements after the dot (scaled in
    bf16 the key would round): with more than one block per key, one dot per block over q
    masked to that block.
    """
    keys = tl.trans(_stored_keys(buf_u8, buf_bf16, page, slot, mask, page_bytes, D, IS_FP8))
    keys = keys.to(DOT)
    if IS_FP8:
        scales = tl.load(
            buf_f32 + _scale_offsets(page, slot, page_bytes, entries, D, NB),
            mask=mask[:, None],
            other=0.0,
        )
        cols = tl.arange(0, D)
        logits = tl.zeros((q_hi.shape[0], keys.shape[1]), tl.float32)
        for b in tl.static_range(NB):
            in_block = (cols // (D // NB) == b)[None, :]
            part = tl.dot(tl.where(in_block, q_hi, 0.0), keys)
            part = tl.dot(tl.where(in_block, q_lo, 0.0), keys, part)
            scale = tl.sum(tl.where(tl.arange(0, NB)[None, :] == b, scales, 0.0), axis=1)
            logits += part * scale[None, :]
    else:
        logits = tl.dot(q_lo, keys, tl.dot(q_hi, keys))
    return logits


@triton.jit
def score_kernel(
    buf_u8, buf_f32, buf_bf16, page_ptr, slot_ptr, q_hi_ptr, q_lo_ptr, w_ptr, out_ptr, n,
    tokens, heads, page_bytes, entries, D: tl.constexpr, NB: tl.constexpr,
    IS_FP8: tl.constexpr, BLOCK_N: tl.constexpr, HP: tl.constexpr, TB: tl.constexpr,
    BLOCKS: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """TB query tokens' scores over BLOCKS blocks of entries, their q [TB * HP, D] loaded
    once.

    The tokens' (token, head) rows are the dot's M dimension, TB * HP of them (64 when
    compiled, a tensor-core tile: one token of DeepSeek-V4's 64 indexer heads): heads past
    `heads` and tokens past `tokens` are zero queries with zero weights and add exactly 0,
    so any head count takes this kernel.  Keys go from the pages straight into the dot,
    dequantized by their scale after it (`_logits`); nothing but fp32 is summed.  DOT is
    the dots' operand type (`DOT_DTYPE`).
    """
    first_token = tl.program_id(0).to(tl.int64) * TB  # token * n may pass 2^31
    r = tl.arange(0, TB * HP)
    qrow = (first_token + r // HP) * heads + r % HP
    live = (r % HP < heads) & (first_token + r // HP < tokens)
    q_offs = qrow[:, None] * D + tl.arange(0, D)[None, :]
    q_hi = tl.load(q_hi_ptr + q_offs, mask=live[:, None], other=0.0).to(DOT)
    q_lo = tl.load(q_lo_ptr + q_offs, mask=live[:, None], other=0.0).to(DOT)
    w = tl.load(w_ptr + qrow, mask=live, other=0.0)
    token = first_token + tl.arange(0, TB)
    first = tl.program_id(1) * BLOCKS * BLOCK_N
    for start in range(first, tl.minimum(first + BLOCKS * BLOCK_N, n), BLOCK_N):
        rows, mask, page, slot = _block_entries(page_ptr, slot_ptr, start, n, BLOCK_N)
        logits = _logits(
            q_hi, q_lo, buf_u8, buf_f32, buf_bf16, page, slot, mask, page_bytes, entries,
            D, NB, IS_FP8, DOT,
        )  # fmt: skip
        weighted = tl.reshape(tl.maximum(logits, 0.0) * w[:, None], (TB, HP, BLOCK_N))
        out_mask = (token < tokens)[:, None] & mask[None, :]
        tl.store(out_ptr + token[:, None] * n + rows[None, :], tl.sum(weighted, 1), out_mask)


_INTERPRETED = not isinstance(score_kernel, triton.JITFunction)
# The score's dot operands: bf16 when compiled.  Triton 3.8's CPU interpreter multiplies a bf16
# dot's raw bits (its `create_dot` converts only 8-bit floats), so there the same bf16 values
# go in as float32: the same exact products, summed in float32 as a tensor core sums them.
DOT_DTYPE = tl.float32 if _INTERPRETED else tl.bfloat16
# (token, head) query rows per score program: 64 when compiled, Hopper's wgmma tile (m64 for
# one warpgroup), whose q (bf16 hi + lo, 32 KiB) and fp32 accumulator fit sm120's shared
# memory and a thread's registers.  The interpreter pays per program and per operation, not
# per element: there 256 rows, a quarter of the programs.
SCORE_ROWS = 256 if _INTERPRETED else 64


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


def format_constants(fmt: IndexKeyFormat) -> dict[str, int | bool]:
    """The compile-time description of `fmt` every kernel takes (NB >= 1: tl.arange needs it)."""
    return {
        "D": fmt.head_dim,
        "NB": max(1, fmt.head_dim // FP8_BLOCK),
        "IS_FP8": fmt.dtype is IndexDtype.FP8,
    }


def score_constants(fmt: IndexKeyFormat, heads: int, tokens: int) -> dict[str, int | bool]:
    """The score kernel's compile-time constants for `tokens` query tokens of `heads` heads:
    what the launcher passes and `kernels.targets` compiles.  Up to SCORE_ROWS query rows a
    program, fewer when fewer tokens fill them (a decode step of few heads), but at least
    MIN_DOT.  Compiled, at 64 heads and more: one token a program, whatever the count."""
    padded = triton.next_power_of_2(heads)
    rows = min(SCORE_ROWS, max(MIN_DOT, padded * triton.next_power_of_2(tokens)))
    return {
        **format_constants(fmt),
        "BLOCK_N": BLOCK_N,
        "HP": padded,
        "TB": max(1, rows // padded),
        "BLOCKS": SCORE_BLOCKS,
        "DOT": DOT_DTYPE,
    }


def split_bf16(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`x` as two contiguous bf16 tensors hi + lo equal to it within 2^-16 of |x| (each
    rounding to nearest loses at most 2^-8 of what it rounds): the score kernel's q, so its
    bf16 tensor-core dots land within `SCORE_TOLERANCE` of the fp32 reference."""
    x = x.to(torch.float32).contiguous()
    hi = x.to(torch.bfloat16)
    return hi, (x - hi.to(torch.float32)).to(torch.bfloat16)


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
        q_hi, q_lo = split_bf16(q)
        constants = score_constants(fmt, heads, tokens)
        grid = (triton.cdiv(tokens, constants["TB"]), triton.cdiv(n, BLOCK_N * SCORE_BLOCKS))
        score_kernel[grid](
            u8, f32, bf16, page, slot, q_hi, q_lo, w.to(torch.float32).contiguous(), out, n,
            tokens, heads, buf.shape[1], entries, **constants, num_warps=SCORE_WARPS,
        )  # fmt: skip
    return out
