"""Index-K quantize-and-store and read/dequantize: the plain torch reference.

A paged index-K buffer is uint8 `[num_pages, entries * (key_bytes + scale_bytes)]`; entry
`loc` lives on page `loc // entries` at slot `loc % entries`, its key bytes in the page's
key region and its scales in the scale region after all keys (SGLang's `IndexKeyCache`).
fp8: e4m3 keys, one fp32 scale (amax/448) per 128 elements.  fp4: MXFP4, e2m1 nibbles
(even element in the low nibble) and one e8m0 exponent byte per 32 elements.  bf16: raw.
"""

from __future__ import annotations

import torch

from dsv4_engine.features import IndexDtype
from dsv4_engine.index_k import FP4_BLOCK, FP8_BLOCK, IndexKeyFormat

FP8_MAX = 448.0
FP4_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def page_slot(locs: torch.Tensor, entries: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(page, slot) int64 of each entry location: the one mapping every backend shares."""
    locs = locs.to(torch.int64)
    return locs // entries, locs % entries


def entry_rows(
    buf: torch.Tensor, locs: torch.Tensor, fmt: IndexKeyFormat, entries: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(key rows [pages, entries, key_bytes], scale rows [pages, entries, scale_bytes], page,
    slot): views of `buf` indexed by whole rows, one gather per entry instead of per byte."""
    split = entries * fmt.key_bytes
    keys = buf[:, :split].unflatten(1, (entries, fmt.key_bytes))
    scales = buf[:, split:].unflatten(1, (entries, fmt.scale_bytes))
    page, slot = page_slot(locs, entries)
    return keys, scales, page, slot


def quantize(keys: torch.Tensor, fmt: IndexKeyFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """(key bytes [n, key_bytes], scale bytes [n, scale_bytes]) of float keys [n, d]."""
    x = keys.to(torch.float32)
    n = x.shape[0]
    if fmt.dtype is IndexDtype.BF16:
        return x.to(torch.bfloat16).view(torch.uint8).reshape(n, -1), x.new_empty(
            (n, 0), dtype=torch.uint8
        )
    if fmt.dtype is IndexDtype.FP8:
        blocks = x.reshape(n, -1, FP8_BLOCK)
        scale = blocks.abs().amax(-1).clamp(min=1e-12) / FP8_MAX
        q = (blocks / scale[..., None]).to(torch.float8_e4m3fn)
        return q.view(torch.uint8).reshape(n, -1), scale.contiguous().view(torch.uint8)
    return _quantize_fp4(x)


def _quantize_fp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n = x.shape[0]
    blocks = x.reshape(n, -1, FP4_BLOCK)
    amax = blocks.abs().amax(-1)
    exp = torch.ceil(torch.log2(amax.clamp(min=1e-30) / FP4_GRID[-1])).clamp(-127, 127)
    v = blocks / torch.exp2(exp)[..., None]
    grid = torch.tensor(FP4_GRID, device=x.device)
    idx = (v.abs()[..., None] - grid).abs().argmin(-1)
    codes = (idx | ((v < 0).to(torch.int64) << 3)).reshape(n, -1)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed.to(torch.uint8), (exp + 127).to(torch.uint8)


def dequantize(
    key_bytes: torch.Tensor, scale_bytes: torch.Tensor, fmt: IndexKeyFormat
) -> torch.Tensor:
    n = key_bytes.shape[0]
    if fmt.dtype is IndexDtype.BF16:
        return key_bytes.contiguous().view(torch.bfloat16).to(torch.float32)
    if fmt.dtype is IndexDtype.FP8:
        q = key_bytes.contiguous().view(torch.float8_e4m3fn).to(torch.float32)
        scale = scale_bytes.contiguous().view(torch.float32)
        return (q.reshape(n, -1, FP8_BLOCK) * scale[..., None]).reshape(n, -1)
    codes = torch.stack([key_bytes & 0xF, key_bytes >> 4], -1).reshape(n, -1).to(torch.int64)
    grid = torch.tensor(FP4_GRID, device=key_bytes.device)
    v = grid[codes & 7] * (1 - 2 * (codes >> 3)).to(torch.float32)
    scale = torch.exp2(scale_bytes.to(torch.float32) - 127)
    return (v.reshape(n, -1, FP4_BLOCK) * scale[..., None]).reshape(n, -1)


def store_index_k(
    buf: torch.Tensor, locs: torch.Tensor, keys: torch.Tensor, fmt: IndexKeyFormat, entries: int
) -> None:
    key_rows, scale_rows, page, slot = entry_rows(buf, locs, fmt, entries)
    key_bytes, scale_bytes = quantize(keys, fmt)
    key_rows[page, slot] = key_bytes
    if fmt.scale_bytes:
        scale_rows[page, slot] = scale_bytes


def read_index_k(
    buf: torch.Tensor, locs: torch.Tensor, fmt: IndexKeyFormat, entries: int
) -> torch.Tensor:
    key_rows, scale_rows, page, slot = entry_rows(buf, locs, fmt, entries)
    return dequantize(_gather(key_rows, page, slot), scale_rows[page, slot], fmt)


def _gather(rows: torch.Tensor, page: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """rows[page, slot] of byte rows, moved in 8-byte words where the layout allows: the
    same bytes, and a decode batch's indexer gathers thousands of keys a step."""
    aligned = [rows.shape[-1], rows.stride(0), rows.stride(1), rows.storage_offset()]
    if all(n % 8 == 0 for n in aligned):
        return rows.view(torch.int64)[page, slot].view(torch.uint8)
    return rows[page, slot]
