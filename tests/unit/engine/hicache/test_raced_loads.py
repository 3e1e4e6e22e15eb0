"""The injected race (DSV4_INJECT_UNGATED_INDEX_K) happens by construction, not by timing.

A load that draws the race holds each layer's index-K copy until the reading step's first
KV access of that layer, and its pages hold other pages' keys meanwhile: an ungated
index-K read of the loading step is stale however late it comes (a starved engine on a
loaded machine), and even when the allocator hands an offloaded prefix its own pages back
(which still hold the very keys the load brings).  A gated engine reads what was stored.
The real transfer controller, unthrottled, decides what lands.
"""

import time

import pytest
import torch

from dsv4_engine.features import IndexDtype
from dsv4_engine.hicache.cache import HiCache
from dsv4_engine.hicache.host_pool import HostPool
from dsv4_engine.hicache.transfer import TransferController
from dsv4_engine.pools.device_pool import DevicePool
from dsv4_engine.pools.layout import TINY_SHAPE, BufferKind

C4_LAYER = 1  # TINY_SHAPE: SWA, c4, c128, c4
STARVED_S = 0.3  # the reader comes this late: an unthrottled copy would have landed


def _cache(ungated: bool) -> HiCache:
    pool = DevicePool(TINY_SHAPE, 8, IndexDtype.BF16, ungated_index_k=ungated)
    host = HostPool(pool.layout, 8)
    return HiCache(pool, host, TransferController(pool, host))


def _offloaded(cache: HiCache) -> tuple[list[int], torch.Tensor, list[int]]:
    """Pages with known keys on two indexed layers, then pushed to the host tier; another
    prefix's keys fill the rest of the pool.  Returns the device pages, the keys of the c4
    layer, and the host pages."""
    pool = cache.pool
    gen = torch.Generator().manual_seed(3)
    others = pool.allocator.allocate(4)
    pages = pool.allocator.allocate(2)
    for layer in (1, 3):
        for group in (others, pages):
            locs = pool.entry_locs(layer, group)
            pool.store_index_k(layer, locs, torch.randn(len(locs), 128, generator=gen))
            pool.store_kv(layer, locs, torch.randn(len(locs), TINY_SHAPE.kv_dim, generator=gen))
    keys = pool.read_index_k(C4_LAYER, pool.entry_locs(C4_LAYER, pages)).clone()
    return pages, keys, cache.evict(pages, cache.on_insert(pages))


@pytest.mark.parametrize("ungated", [True, False], ids=["raced", "gated"])
def test_the_loading_steps_index_k_read_is_stale_only_when_raced_however_late(ungated):
    cache = _cache(ungated)
    pool = cache.pool
    pages, keys, host_pages = _offloaded(cache)
    loaded, load = cache.load_back(host_pages)
    assert sorted(loaded) == sorted(pages)  # the same pages, still holding these keys
    locs = pool.entry_locs(C4_LAYER, loaded)
    time.sleep(STARVED_S)
    first = pool.read_index_k(C4_LAYER, locs)  # the step's indexer, late
    assert (not torch.equal(first, keys)) is ungated
    assert pool.stale_reads(BufferKind.INDEX_K) == int(ungated)
    pool.read_kv(C4_LAYER, locs)  # the step's attention: the held copy lands, then is read
    assert torch.equal(pool.read_index_k(C4_LAYER, locs), keys)
    load.wait_all(10)
    assert load.finished_ok() and pool.stale_reads(BufferKind.KV) == 0
    cache.close()


def test_a_raced_load_a_caller_waits_for_whole_lands_at_once():
    """A caller that waits for the whole load reads none of it meanwhile: nothing is held
    for it (the hold's bound, `RACED_HOLD_S`, is for a step that never reaches a layer)."""
    cache = _cache(ungated=True)
    _, keys, host_pages = _offloaded(cache)
    loaded, load = cache.load_back(host_pages)
    load.wait_all(10)
    assert load.finished_ok()
    pool = cache.pool
    assert torch.equal(pool.read_index_k(C4_LAYER, pool.entry_locs(C4_LAYER, loaded)), keys)
    cache.close()
