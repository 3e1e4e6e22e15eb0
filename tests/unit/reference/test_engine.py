"""The reference engine in-process: batch invariance, prefix cache, HiCache round trips."""

from __future__ import annotations

import random
import threading

import pytest

from dsv4_engine.features import IndexDtype
from dsv4_engine.hicache.transfer import TransferFault
from dsv4_engine.pools.layout import BufferKind
from dsv4_engine.reference.engine import Engine, Request
from dsv4_engine.reference.settings import ServeSettings

TIMEOUT_S = 120


def prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return list(rng.choices(b"abcdefgh ijklmnop", k=length))


def generate(engine: Engine, prompts: list[list[int]], n: int = 6) -> list[list[int]]:
    """Submit every prompt at once; their greedy tokens, in order."""
    outs: list[list[int]] = [[] for _ in prompts]
    errors: list[str] = []
    left = threading.Semaphore(0)

    def done(_: str, error: str | None) -> None:
        if error:
            errors.append(error)
        left.release()

    for p, out in zip(prompts, outs, strict=True):
        engine.submit(Request(p, n, out.append, done))
    for _ in prompts:
        assert left.acquire(timeout=TIMEOUT_S), "engine did not finish in time"
    assert not errors
    return outs


@pytest.fixture
def make_engine():
    engines: list[Engine] = []

    def make(**kw) -> Engine:
        engine = Engine(ServeSettings(**kw))
        engine.start()
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.stop()


def test_answers_do_not_depend_on_the_rest_of_the_batch(make_engine):
    # Decode steps run batched: 40 tokens from 250 cross c4 blocks and a c128 block (256);
    # 129 and 1 end their prompts on a one-token chunk, which runs among the decode rows.
    engine = make_engine()
    targets = [prompt(1, 250), prompt(11, 129), prompt(12, 1)]
    alone = [generate(engine, [t], n=40)[0] for t in targets]
    crowd = [prompt(s, 100 + 37 * s) for s in range(2, 9)]
    batched = generate(engine, [*crowd[:3], *targets, *crowd[3:]], n=40)[3:6]
    assert batched == alone
    assert generate(engine, [*targets[::-1], crowd[0]], n=40)[2::-1] == alone
    assert len({tuple(a) for a in alone}) == 3  # the answers differ: equality is not vacuous


def test_prefix_cache_hit_gives_the_cold_answer(make_engine):
    engine = make_engine()
    shared = prompt(2, 400)
    cold = generate(engine, [shared + prompt(3, 20)])[0]
    engine.call(lambda: None).result(timeout=TIMEOUT_S)
    cached_before = engine.stats.cached_tokens
    other = generate(engine, [shared + prompt(4, 20)])[0]
    assert engine.stats.cached_tokens - cached_before == 384  # 3 full pages of the prefix
    fresh = make_engine()
    assert generate(fresh, [shared + prompt(4, 20)])[0] == other
    assert cold != other  # the suffix matters: the comparison above is not vacuous


@pytest.mark.parametrize("dtype", [IndexDtype.FP8, IndexDtype.BF16])
def test_offload_and_reload_through_the_gate_is_bit_exact(make_engine, dtype):
    engine = make_engine(
        enable_hierarchical_cache=True, hicache_ratio=2, hicache_bandwidth_mb_s=4, index_dtype=dtype
    )
    prompts = [prompt(10 + i % 3, 520) + prompt(20 + i, 9) for i in range(6)]
    cold = generate(engine, prompts)
    offloaded = engine.call(engine.offload).result(timeout=TIMEOUT_S)
    assert offloaded > 0 and engine.stats.load_back_tokens == 0
    warm = generate(engine, prompts)
    assert engine.stats.load_back_tokens > 0
    assert warm == cold


def test_device_pressure_evicts_to_host_and_loads_back(make_engine):
    # 8 device pages: the second wave evicts the first wave's prefixes to the host tier.
    engine = make_engine(
        enable_hierarchical_cache=True, hicache_ratio=4, max_total_tokens=1024,
        max_running_requests=2,
    )  # fmt: skip
    first = [prompt(30 + i, 300) for i in range(2)]
    second = [prompt(40 + i, 300) for i in range(2)]
    cold = generate(engine, first)
    generate(engine, second)
    assert generate(engine, first) == cold
    assert engine.stats.load_back_tokens > 0


def test_without_hicache_eviction_drops_and_recomputes(make_engine):
    engine = make_engine(max_total_tokens=1024, max_running_requests=2)
    first = [prompt(50 + i, 300) for i in range(2)]
    cold = generate(engine, first)
    generate(engine, [prompt(60 + i, 300) for i in range(2)])
    assert generate(engine, first) == cold
    assert engine.stats.load_back_tokens == 0


def test_a_corrupted_load_fails_its_requests_and_the_engine_recovers(make_engine):
    engine = make_engine(enable_hierarchical_cache=True, hicache_ratio=2)
    prompts = [prompt(70, 300)]
    cold = generate(engine, prompts)
    engine.call(engine.offload).result(timeout=TIMEOUT_S)
    controller = engine.hicache.controller
    real_load = controller.load
    # Fault injection: flip a byte of layer 1's index-K in transit, once.
    fault = TransferFault(layer=1, kind=BufferKind.INDEX_K, byte=7)
    controller.load = lambda host, dev, _=None: real_load(host, dev, fault)
    errors: list[str] = []
    finished = threading.Event()
    engine.submit(Request(prompts[0], 4, lambda _: None,
                          lambda _, err: (errors.append(err), finished.set())))  # fmt: skip
    assert finished.wait(TIMEOUT_S)
    assert errors and "checksum" in errors[0]
    controller.load = real_load
    assert generate(engine, prompts) == cold  # reloaded from the intact host copy
    assert engine.stats.transfer_failures == 1
