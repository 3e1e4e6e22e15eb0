"""Device pools: byte layout, page reuse, index-K round trips."""

import pytest
import torch

from dsv4_engine.features import IndexDtype
from dsv4_engine.index_k import index_k_bytes_per_token
from dsv4_engine.kernels.index_k_ref import FP8_MAX
from dsv4_engine.pools.allocator import OutOfPages, PageAllocator
from dsv4_engine.pools.device_pool import DevicePool
from dsv4_engine.pools.layout import (
    TINY_SHAPE,
    BufferKind,
    ModelShape,
    pool_layout,
)

# The fields of deepseek-ai/DeepSeek-V4-Flash config.json that size the pools.
FLASH_CONFIG = {
    "num_hidden_layers": 43,
    "compress_ratios": [0, 0] + [4, 128] * 20 + [4, 0],  # + the MTP layer's entry
    "head_dim": 512,
    "index_head_dim": 128,
    "index_n_heads": 64,
}
ALL_DTYPES = [IndexDtype.FP8, IndexDtype.BF16, IndexDtype.FP4]


@pytest.mark.parametrize(
    ("dtype", "head_dim", "expected"),
    [
        (IndexDtype.FP8, 128, 132),
        (IndexDtype.FP8, 256, 264),
        (IndexDtype.FP4, 128, 68),
        (IndexDtype.BF16, 128, 256),
        (IndexDtype.BF16, 64, 128),
    ],
)
def test_index_k_bytes_follow_the_formulas(dtype, head_dim, expected):
    assert index_k_bytes_per_token(dtype, head_dim) == expected


def test_fp8_head_dim_must_fill_whole_scale_blocks():
    with pytest.raises(
        ValueError, match=r"index_head_dim=96: fp8 index-K needs .* multiple of 128"
    ):
        index_k_bytes_per_token(IndexDtype.FP8, 96)


def test_a_compress_ratio_must_divide_the_page():
    with pytest.raises(ValueError, match=r"compress_ratios\[1\]=128: .* page_size=64"):
        ModelShape((0, 128), kv_dim=8, index_head_dim=128, index_n_heads=16, page_size=64)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_flash_layout_prices_index_k_on_each_c4_layer(dtype):
    shape = ModelShape.from_hf_config(FLASH_CONFIG, page_size=128)
    layout = pool_layout(shape, dtype)
    index_segments = [s for s in layout.segments if s.kind is BufferKind.INDEX_K]
    assert shape.num_layers == 43
    assert len(index_segments) == 21  # V4-Flash: 21 c4 layers
    per_token = index_k_bytes_per_token(dtype, 128)
    assert all(s.entries == 32 and s.page_bytes == 32 * per_token for s in index_segments)
    c128 = layout.segment(3, BufferKind.KV)
    assert (c128.entries, c128.page_bytes) == (1, 512 * 2)


def test_missing_config_field_is_named():
    with pytest.raises(ValueError, match="missing field 'index_head_dim'"):
        ModelShape.from_hf_config(
            {"num_hidden_layers": 2, "compress_ratios": [0, 4], "head_dim": 8}
        )


def test_allocator_reuses_the_last_freed_page_first():
    alloc = PageAllocator(4)
    a = alloc.allocate(2)
    b = alloc.allocate(1)
    alloc.free(a)
    assert alloc.allocate(2) == a
    with pytest.raises(OutOfPages, match="asked for 2 pages, 1 free of 4"):
        alloc.allocate(2)
    alloc.free(b)
    with pytest.raises(ValueError, match="not allocated"):
        alloc.free(b)


def test_a_fresh_page_holds_the_previous_owners_index_k():
    pool = DevicePool(TINY_SHAPE, 4, IndexDtype.BF16)
    old = pool.allocator.allocate(1)
    locs = pool.entry_locs(1, old)
    keys = torch.randn(len(locs), 128).to(torch.bfloat16).float()
    pool.store_index_k(1, locs, keys)
    pool.allocator.free(old)
    new = pool.allocator.allocate(1)
    assert new == old
    assert torch.equal(pool.read_index_k(1, pool.entry_locs(1, new)), keys)


def test_bf16_index_k_round_trips_exactly():
    pool = DevicePool(TINY_SHAPE, 3, IndexDtype.BF16)
    locs = pool.entry_locs(3, pool.allocator.allocate(2))
    keys = (torch.randn(len(locs), 128) * 5).to(torch.bfloat16).float()
    pool.store_index_k(3, locs, keys)
    assert torch.equal(pool.read_index_k(3, locs), keys)


def test_fp8_index_k_round_trips_within_fp8_error():
    pool = DevicePool(TINY_SHAPE, 3, IndexDtype.FP8)
    locs = pool.entry_locs(1, pool.allocator.allocate(2))
    keys = torch.randn(len(locs), 128) * torch.logspace(-3, 2, len(locs))[:, None]
    pool.store_index_k(1, locs, keys)
    got = pool.read_index_k(1, locs)
    amax = keys.abs().amax(1, keepdim=True)
    # e4m3: 3 mantissa bits (relative error <= 2^-4), subnormal steps of amax/448 * 2^-9.
    bound = keys.abs() * 2**-4 + amax / FP8_MAX * 2**-9
    assert (got - keys).abs().le(bound).all()
    assert not torch.equal(got, keys)  # it really is quantized


def test_fp4_index_k_round_trips_within_fp4_error():
    pool = DevicePool(TINY_SHAPE, 2, IndexDtype.FP4)
    locs = pool.entry_locs(1, pool.allocator.allocate(1))
    keys = torch.randn(len(locs), 128)
    pool.store_index_k(1, locs, keys)
    got = pool.read_index_k(1, locs)
    amax = keys.reshape(len(locs), -1, 32).abs().amax(-1, keepdim=True)
    # Grid steps are at most 2 (4 -> 6) in units of the scale 2^e <= amax/3.
    assert ((got - keys).reshape(len(locs), -1, 32).abs() <= amax / 3 + 1e-6).all()


def test_fp8_page_holds_all_keys_then_all_scales():
    pool = DevicePool(TINY_SHAPE, 2, IndexDtype.FP8)
    page = pool.allocator.allocate(2)[1]
    slot = 5
    key = torch.randn(1, 128)
    pool.store_index_k(1, torch.tensor([page * 32 + slot]), key)
    row = pool.buffer(1, BufferKind.INDEX_K)[page]
    scale = key.abs().max() / FP8_MAX
    stored_scale = row[32 * 128 + slot * 4 : 32 * 128 + slot * 4 + 4].view(torch.float32)
    assert torch.equal(stored_scale, scale.reshape(1))
    stored_key = row[slot * 128 : (slot + 1) * 128].view(torch.float8_e4m3fn).float() * scale
    assert torch.allclose(stored_key, key[0], rtol=2**-4, atol=float(scale) * 2**-9)
