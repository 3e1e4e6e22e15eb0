"""The pool counts stale reads it observes: each (layer, page) carries the generation of the
load that last filled it next to the one it is owed, and every KV and index-K read compares
them.  Loads are driven by hand here (LayerLoad, _expect_load, _mark_landed), so each read
happens exactly where the test puts it; the real transfer controller is used where it
decides what lands."""

import pytest
import torch

from dsv4_engine.features import IndexDtype
from dsv4_engine.hicache.cache import HiCache
from dsv4_engine.hicache.host_pool import HostPool
from dsv4_engine.hicache.transfer import TransferController, TransferFault
from dsv4_engine.pools.device_pool import DevicePool
from dsv4_engine.pools.gate import LayerLoad, TransferFailed
from dsv4_engine.pools.layout import TINY_SHAPE, BufferKind

C4_LAYER = 1  # TINY_SHAPE: SWA, c4, c128, c4


def _pool(ungated):
    return DevicePool(TINY_SHAPE, 4, IndexDtype.BF16, ungated_index_k=ungated)


def _start_load(pool, pages):
    """A load of `pages` registered with the gate, none of its layers landed yet."""
    load = LayerLoad(TINY_SHAPE.num_layers)
    pool.gate.register(load)
    rows = torch.tensor(pages)
    return load, rows, pool._expect_load(rows)


def _land(pool, load, rows, generation, layers):
    for layer in layers:
        pool._mark_landed(layer, rows, generation, None)
        load.layer_done(layer)


def test_an_index_k_read_that_skips_the_gate_and_outruns_its_load_is_counted():
    pool = _pool(ungated=True)
    pages = pool.allocator.allocate(2)
    load, rows, generation = _start_load(pool, pages)
    locs = pool.entry_locs(C4_LAYER, pages)
    pool.index_scores(C4_LAYER, locs, torch.ones(1, 16, 128), torch.ones(1, 16))
    pool.read_index_k(C4_LAYER, locs)
    assert pool.stale_reads(BufferKind.INDEX_K) == 2
    _land(pool, load, rows, generation, range(TINY_SHAPE.num_layers))
    pool.read_index_k(C4_LAYER, locs)  # landed: not stale, though the load is still tracked
    assert pool.gate.tracking()
    assert pool.stale_reads(BufferKind.INDEX_K) == 2
    assert pool.stale_reads(BufferKind.KV) == 0


def test_gated_reads_wait_until_their_pages_landed_so_none_is_counted():
    pool = _pool(ungated=False)
    pages = pool.allocator.allocate(2)
    load, rows, generation = _start_load(pool, pages)
    _land(pool, load, rows, generation, [0, 1])
    pool.read_kv(C4_LAYER, pool.entry_locs(C4_LAYER, pages))
    pool.read_index_k(C4_LAYER, pool.entry_locs(C4_LAYER, pages))
    assert pool.stale_reads(BufferKind.KV) == pool.stale_reads(BufferKind.INDEX_K) == 0


def test_a_gate_that_lets_a_read_through_early_is_caught(monkeypatch):
    """The zero above is not given: a gate that does not wait makes it count."""
    pool = _pool(ungated=False)
    pages = pool.allocator.allocate(2)
    _start_load(pool, pages)
    monkeypatch.setattr(pool.gate, "wait_layer", lambda layer: None)
    pool.read_kv(0, pool.entry_locs(0, pages))
    pool.read_index_k(C4_LAYER, pool.entry_locs(C4_LAYER, pages))
    assert pool.stale_reads(BufferKind.KV) == 1
    assert pool.stale_reads(BufferKind.INDEX_K) == 1


def test_only_the_pages_a_load_owes_count():
    pool = _pool(ungated=True)
    loaded, fresh = pool.allocator.allocate(2), pool.allocator.allocate(2)
    _start_load(pool, loaded)
    pool.read_index_k(C4_LAYER, pool.entry_locs(C4_LAYER, fresh))
    assert pool.stale_reads(BufferKind.INDEX_K) == 0
    pool.read_index_k(C4_LAYER, pool.entry_locs(C4_LAYER, [fresh[0], loaded[1]]))
    assert pool.stale_reads(BufferKind.INDEX_K) == 1


def test_a_failed_loads_pages_are_owed_nothing_once_reused():
    """The transfer controller forgives a load that failed its checksum: its pages are
    dropped and reused fresh, and reads of them must not count while other loads run."""
    pool = DevicePool(TINY_SHAPE, 8, IndexDtype.BF16, ungated_index_k=True)
    host = HostPool(pool.layout, 8)
    cache = HiCache(pool, host, TransferController(pool, host))
    pages = pool.allocator.allocate(2)
    for layer in range(TINY_SHAPE.num_layers):
        pool.store_kv(layer, pool.entry_locs(layer, pages), torch.ones(1, TINY_SHAPE.kv_dim))
    host_pages = cache.evict(pages, cache.on_insert(pages))
    fault = TransferFault(layer=C4_LAYER, kind=BufferKind.KV)
    failed_pages, load = cache.load_back(host_pages, fault=fault)
    with pytest.raises(TransferFailed, match=f"layer {C4_LAYER} kv: host pages"):
        load.wait_all(30)
    pool.gate.discard(load)
    pool.allocator.free(failed_pages)
    reused = pool.allocator.allocate(2)
    assert sorted(reused) == sorted(failed_pages)
    loading = pool.allocator.allocate(2)
    _start_load(pool, loading)  # another load in flight keeps the check running
    for layer in (1, 3):  # index-K skips the gate here: the reads happen during that load
        pool.read_index_k(layer, pool.entry_locs(layer, reused))
    assert pool.stale_reads(BufferKind.INDEX_K) == 0
    pool.read_index_k(C4_LAYER, pool.entry_locs(C4_LAYER, loading))
    assert pool.stale_reads(BufferKind.INDEX_K) == 1
    cache.close()
