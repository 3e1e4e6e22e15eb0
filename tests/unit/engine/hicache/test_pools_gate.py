"""The one per-layer gate: every buffer waits for its layer's load; the injection skips index-K."""

import logging
import threading

import pytest
import torch

from dsv4_engine.features import IndexDtype
from dsv4_engine.pools.device_pool import UNGATED_INDEX_K_ENV, DevicePool
from dsv4_engine.pools.gate import LayerLoad, TransferFailed, TransferTimeout
from dsv4_engine.pools.layout import TINY_SHAPE, BufferKind

SETTLE_S = 0.05  # long enough for an unblocked read to finish on a busy machine


def _read_in_thread(pool, layer, kind):
    done = threading.Event()

    def read():
        pool.buffer(layer, kind)
        done.set()

    threading.Thread(target=read, daemon=True).start()
    return done


def _pool(**kwargs):
    return DevicePool(TINY_SHAPE, 2, IndexDtype.FP8, ungated_index_k=False, **kwargs)


@pytest.mark.parametrize("key", _pool().buffer_kinds(), ids=lambda k: f"layer{k[0]}-{k[1].value}")
def test_every_buffer_waits_for_its_layer(key):
    layer, kind = key
    pool = _pool()
    load = LayerLoad(TINY_SHAPE.num_layers)
    pool.gate.register(load)
    for done_layer in range(layer):
        load.layer_done(done_layer)
    done = _read_in_thread(pool, layer, kind)
    assert not done.wait(SETTLE_S), "read returned before its layer was loaded"
    load.layer_done(layer)
    assert done.wait(5)


def test_the_pool_exposes_no_buffer_outside_the_gate():
    pool = _pool()
    for name in dir(pool):
        if name.startswith("_"):
            continue
        value = getattr(pool, name)
        assert not isinstance(value, torch.Tensor), name
        if isinstance(value, dict | list | tuple):
            assert not any(isinstance(v, torch.Tensor) for v in value), name


def test_injection_skips_the_gate_for_index_k_only(monkeypatch, caplog):
    monkeypatch.setenv(UNGATED_INDEX_K_ENV, "1")
    with caplog.at_level(logging.WARNING):
        pool = DevicePool(TINY_SHAPE, 2, IndexDtype.BF16)
    assert any(
        r.levelno == logging.WARNING and "FAULT INJECTION" in r.getMessage() for r in caplog.records
    )
    load = LayerLoad(TINY_SHAPE.num_layers)
    pool.gate.register(load)
    assert _read_in_thread(pool, 1, BufferKind.INDEX_K).wait(5)
    kv = _read_in_thread(pool, 1, BufferKind.KV)
    state = _read_in_thread(pool, 1, BufferKind.COMPRESS_STATE)
    assert not kv.wait(SETTLE_S) and not state.wait(SETTLE_S)
    for layer in range(TINY_SHAPE.num_layers):  # release the blocked readers
        load.layer_done(layer)
    assert kv.wait(5) and state.wait(5)


def test_injection_is_off_unless_asked(monkeypatch, caplog):
    monkeypatch.delenv(UNGATED_INDEX_K_ENV, raising=False)
    with caplog.at_level(logging.WARNING):
        pool = DevicePool(TINY_SHAPE, 2, IndexDtype.BF16)
    assert not pool.ungated_index_k and not caplog.records


@pytest.mark.parametrize("value", ["yes", "-0.1", "2"])
def test_a_bad_injection_value_is_rejected(monkeypatch, value):
    monkeypatch.setenv(UNGATED_INDEX_K_ENV, value)
    with pytest.raises(ValueError, match=f"{UNGATED_INDEX_K_ENV}='{value}': expected 0, 1 or"):
        DevicePool(TINY_SHAPE, 2, IndexDtype.BF16)


def test_a_share_skips_only_the_loads_that_drew_the_race(monkeypatch):
    """DSV4_INJECT_UNGATED_INDEX_K=0.5: index-K reads wait for a load that did not draw the
    race and skip one that did; KV reads wait for both."""
    monkeypatch.setenv(UNGATED_INDEX_K_ENV, "0.5")
    pool = DevicePool(TINY_SHAPE, 2, IndexDtype.BF16)
    draws = [pool._load_races() for _ in range(400)]
    assert 0.4 < sum(draws) / len(draws) < 0.6  # each load draws with the share
    raced = LayerLoad(TINY_SHAPE.num_layers, raced=True)
    pool.gate.register(raced)
    assert _read_in_thread(pool, 1, BufferKind.INDEX_K).wait(5)
    kv = _read_in_thread(pool, 1, BufferKind.KV)
    assert not kv.wait(SETTLE_S)
    gated = LayerLoad(TINY_SHAPE.num_layers)
    pool.gate.register(gated)
    index_k = _read_in_thread(pool, 1, BufferKind.INDEX_K)
    assert not index_k.wait(SETTLE_S)
    for load in (raced, gated):  # release the blocked readers
        for layer in range(TINY_SHAPE.num_layers):
            load.layer_done(layer)
    assert kv.wait(5) and index_k.wait(5)


def test_a_stuck_load_times_out_instead_of_hanging():
    pool = _pool(gate_timeout_s=0.2)
    pool.gate.register(LayerLoad(TINY_SHAPE.num_layers))
    with pytest.raises(TransferTimeout, match=r"layer 0 not loaded after 0.2s \(0/4 layers done\)"):
        pool.buffer(0, BufferKind.KV)


def test_a_failed_layer_fails_its_readers_and_spares_earlier_layers():
    pool = _pool()
    load = LayerLoad(TINY_SHAPE.num_layers)
    pool.gate.register(load)
    load.layer_done(0)
    load.fail(TransferFailed("layer 1 index_k: host pages [3] arrived with a wrong checksum"))
    pool.buffer(0, BufferKind.KV)
    with pytest.raises(TransferFailed, match="wrong checksum"):
        pool.buffer(1, BufferKind.INDEX_K)
    later = LayerLoad(TINY_SHAPE.num_layers)  # a later load does not hide the failure
    pool.gate.register(later)
    for layer in range(TINY_SHAPE.num_layers):
        later.layer_done(layer)
    with pytest.raises(TransferFailed):
        pool.buffer(3, BufferKind.KV)
    pool.gate.discard(load)  # the engine dropped the failed pages
    pool.buffer(3, BufferKind.KV)


def test_layers_must_finish_in_order():
    load = LayerLoad(3)
    with pytest.raises(RuntimeError, match="layer 1 done out of order"):
        load.layer_done(1)


def test_a_verdict_that_arrives_after_every_layer_was_handed_out_fails_its_layers():
    """On CUDA a checksum verdict reaches the host once the copy stream ran, after the
    layers were released: it fails reads from its layer on, not the ones before it."""
    pool = _pool()
    load = LayerLoad(TINY_SHAPE.num_layers)
    pool.gate.register(load)
    for layer in range(TINY_SHAPE.num_layers):
        load.layer_done(layer)
    load.fail(TransferFailed("layer 2 kv: host pages [5] arrived with a wrong checksum"), 2)
    pool.buffer(1, BufferKind.INDEX_K)
    for layer in (2, 3):
        with pytest.raises(TransferFailed, match="layer 2 kv"):
            pool.buffer(layer, BufferKind.KV)
    assert not load.finished_ok()
