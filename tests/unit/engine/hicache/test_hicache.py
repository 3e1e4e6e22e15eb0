"""HiCache host tier: layouts, capacity, LRU, write policies, paced loads, checksums."""

import time

import pytest
import torch

from dsv4_engine.features import HiCacheFeature, HiCacheMemLayout, HiCacheWritePolicy, IndexDtype
from dsv4_engine.hicache.cache import HiCache
from dsv4_engine.hicache.host_pool import HostPool, HostPoolFull, host_capacity_pages
from dsv4_engine.hicache.transfer import TransferController, TransferFault
from dsv4_engine.pools.device_pool import DevicePool
from dsv4_engine.pools.gate import TransferFailed
from dsv4_engine.pools.layout import TINY_SHAPE, BufferKind, pool_layout

ALL_DTYPES = [IndexDtype.FP8, IndexDtype.BF16, IndexDtype.FP4]


def _hicache(dtype=IndexDtype.FP8, layout=HiCacheMemLayout.PAGE_FIRST, policy="write_through",
             bandwidth=None, host_pages=8, device_pages=8, verify=True):  # fmt: skip
    pool = DevicePool(TINY_SHAPE, device_pages, dtype, ungated_index_k=False)
    host = HostPool(pool.layout, host_pages, layout)
    controller = TransferController(
        pool, host, bandwidth_bytes_per_s=bandwidth, verify_checksums=verify
    )
    return HiCache(pool, host, controller, HiCacheWritePolicy(policy))


def _fill(pool, pages, seed):
    """Write every paged buffer of `pages`; returns what a reader should get back."""
    gen = torch.Generator().manual_seed(seed)
    want = {}
    for layer in range(TINY_SHAPE.num_layers):
        locs = pool.entry_locs(layer, pages)
        kv = torch.randn(len(locs), TINY_SHAPE.kv_dim, generator=gen)
        pool.store_kv(layer, locs, kv)
        want[(layer, BufferKind.KV)] = pool.read_kv(layer, locs).clone()
        if TINY_SHAPE.compress_ratios[layer] == 4:
            keys = torch.randn(len(locs), TINY_SHAPE.index_head_dim, generator=gen)
            pool.store_index_k(layer, locs, keys)
            want[(layer, BufferKind.INDEX_K)] = pool.read_index_k(layer, locs)
    return want


def _read(pool, pages):
    got = {}
    for layer in range(TINY_SHAPE.num_layers):
        locs = pool.entry_locs(layer, pages)
        got[(layer, BufferKind.KV)] = pool.read_kv(layer, locs)
        if TINY_SHAPE.compress_ratios[layer] == 4:
            got[(layer, BufferKind.INDEX_K)] = pool.read_index_k(layer, locs)
    return got


def _assert_same(got, want):
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key].view(torch.uint8), want[key].view(torch.uint8)), key


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("layout", list(HiCacheMemLayout))
def test_evict_then_load_back_restores_every_byte(dtype, layout):
    cache = _hicache(dtype, layout)
    pool = cache.pool
    pages = pool.allocator.allocate(3)
    want = _fill(pool, pages, seed=1)
    host_pages = cache.evict(pages, cache.on_insert(pages))
    other = pool.allocator.allocate(3)  # another request reuses and overwrites the pages
    _fill(pool, other, seed=2)
    pool.allocator.free(other)
    new_pages, load = cache.load_back(host_pages)
    _assert_same(_read(pool, new_pages), want)
    assert load.done()
    cache.close()


def test_host_layouts_place_pages_and_layers_as_named():
    layout = pool_layout(TINY_SHAPE, IndexDtype.FP8)
    page_first = HostPool(layout, 4, HiCacheMemLayout.PAGE_FIRST)
    layer_first = HostPool(layout, 4, HiCacheMemLayout.LAYER_FIRST)
    # page_first: one page is one row of every layer; layer_first: one layer is one block.
    assert page_first.segment(1, BufferKind.INDEX_K).stride(0) == layout.page_bytes
    assert layer_first.segment(1, BufferKind.INDEX_K).stride(0) == layout.layer_page_bytes(1)
    assert layer_first.segment(0, BufferKind.KV).is_contiguous()


def test_capacity_from_ratio_or_size():
    layout = pool_layout(TINY_SHAPE, IndexDtype.BF16)
    assert host_capacity_pages(layout, 10, ratio=2.5) == 25
    assert host_capacity_pages(layout, 10, ratio=2.0, size_bytes=7 * layout.page_bytes + 1) == 7
    with pytest.raises(ValueError, match=r"hicache ratio=1\.0: expected a number > 1"):
        host_capacity_pages(layout, 10, ratio=1.0)
    with pytest.raises(ValueError, match="expected at least one page"):
        host_capacity_pages(layout, 10, size_bytes=10)


def test_build_from_the_shared_feature_flags():
    pool = DevicePool(TINY_SHAPE, 4, IndexDtype.FP8, ungated_index_k=False)
    feature = HiCacheFeature(
        enabled=True, ratio=3, write_policy="write_back", mem_layout="layer_first"
    )
    cache = HiCache.build(pool, feature)
    assert cache.host.num_pages == 12
    assert cache.host.mem_layout is HiCacheMemLayout.LAYER_FIRST
    assert cache.write_policy is HiCacheWritePolicy.WRITE_BACK
    cache.close()


def test_lru_evicts_the_least_recently_used_unpinned_pages():
    evicted = []
    host = HostPool(pool_layout(TINY_SHAPE, IndexDtype.FP8), 4, on_evict=evicted.extend)
    a = host.allocate(2)
    b = host.allocate(2)
    host.touch(a)
    c = host.allocate(2)
    assert sorted(evicted) == sorted(b)
    host.pin(a + c)
    with pytest.raises(HostPoolFull, match="asked for 2 host pages: 0 free, 0 evictable of 4"):
        host.allocate(2)


def test_write_policies_decide_when_pages_reach_host():
    through = _hicache(policy="write_through")
    assert through.on_insert(through.pool.allocator.allocate(1)) is not None
    back = _hicache(policy="write_back")
    pages = back.pool.allocator.allocate(2)
    assert back.on_insert(pages) is None and back.host.free_pages == 8
    assert len(back.evict(pages, None)) == 2 and back.host.free_pages == 6
    selective = _hicache(policy="write_through_selective")
    pages = selective.pool.allocator.allocate(1)
    assert selective.on_insert(pages, hits=1) is None
    assert selective.on_insert(pages, hits=2) is not None
    for cache in (through, back, selective):
        cache.close()


def test_a_load_takes_at_least_its_bytes_over_the_bandwidth():
    """Each load waits out its bytes over the bandwidth, so bf16's larger index-K pages take
    longer to come back than fp8's.  Asserted through each load's own floor, not by timing
    one load against the other: on a busy machine the fp8 load alone can be delayed past the
    bf16 one (it was, once, in a CI run)."""
    floors = {}
    for dtype in (IndexDtype.FP8, IndexDtype.BF16):
        cache = _hicache(dtype, bandwidth=2e6)
        pages = cache.pool.allocator.allocate(4)
        host_pages = cache.evict(pages, cache.on_insert(pages))
        floors[dtype] = 4 * cache.pool.layout.page_bytes / 2e6
        start = time.monotonic()
        _, load = cache.load_back(host_pages)
        load.wait_all(30)
        assert time.monotonic() - start >= floors[dtype]
        cache.close()
    assert floors[IndexDtype.BF16] > floors[IndexDtype.FP8]


def _load_back_with_a_flipped_byte(verify):
    """Fill 3 pages, evict them, load them back flipping a byte of page 1's layer-1 index-K."""
    cache = _hicache(verify=verify)
    pages = cache.pool.allocator.allocate(3)
    want = _fill(cache.pool, pages, seed=3)
    host_pages = cache.evict(pages, cache.on_insert(pages))
    fault = TransferFault(layer=1, kind=BufferKind.INDEX_K, page_index=1, byte=7)
    new_pages, _ = cache.load_back(host_pages, fault=fault)
    return cache, want, host_pages, new_pages


def test_a_page_corrupted_in_transit_fails_its_checksum():
    cache, want, host_pages, new_pages = _load_back_with_a_flipped_byte(verify=True)
    pool = cache.pool
    locs = pool.entry_locs(0, new_pages)
    assert torch.equal(pool.read_kv(0, locs), want[(0, BufferKind.KV)])
    with pytest.raises(TransferFailed, match=rf"layer 1 index_k: host pages \[{host_pages[1]}\]"):
        pool.read_index_k(1, pool.entry_locs(1, new_pages))
    cache.close()


def test_without_checksums_the_same_corruption_goes_unnoticed():
    cache, want, _, new_pages = _load_back_with_a_flipped_byte(verify=False)
    pool = cache.pool
    got = pool.read_index_k(1, pool.entry_locs(1, new_pages))
    assert not torch.equal(got, want[(1, BufferKind.INDEX_K)])
    cache.close()
