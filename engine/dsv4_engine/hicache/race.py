"""The seed's HiCache index-K race, reproduced on demand against a no-HiCache reference.

One trial: R requests each write a prefix (KV, index-K, compress state) and read it once
with nothing in flight; that read is the reference.  The prefixes are backed up to host
(write-through) and evicted; other requests reuse and overwrite the freed pages (pages are
never cleared); then one batch loads every prefix back while each request runs its
forward pass concurrently, layer by layer: on a c4 layer the lightning indexer reads
index-K, scores, takes top-k, then attention reads KV at the top-k entries.  Each layer's
"compute" takes a seeded random time, the part of a real forward pass that is GPU time.

With the gate every read waits for its layer, so every request matches the reference bit
for bit.  With `ungated_index_k` an indexer that outruns the copy reads the previous
owner's keys: the trial records which requests saw stale index-K and a changed top-k set,
and how many reads the pool itself observed reading a page its load had not landed yet.
The same seed gives the same compute times whatever the index dtype, so fp8 and bf16 runs
are paired and differ only in how long the copy takes.

The indexer scores and selects with the pool's kernels (`index_scores`, `ops.topk`), the
ones the engine ships, on the backend the config names.  On CUDA (`device="cuda"`) the copy
is not throttled and a layer's compute is GPU time (`torch.cuda._sleep`) on the reader's
stream, so the race plays out between the copy stream and compute as on a real engine.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

import torch

from dsv4_engine.features import HiCacheWritePolicy, IndexDtype
from dsv4_engine.hicache.cache import HiCache
from dsv4_engine.hicache.host_pool import HostPool
from dsv4_engine.hicache.transfer import TransferController
from dsv4_engine.pools.device_pool import DevicePool
from dsv4_engine.pools.layout import INDEXED_RATIO, TINY_SHAPE, BufferKind, ModelShape

GPU_CYCLES_PER_S = 1.5e9  # torch.cuda._sleep counts clock cycles; roughly a GPU's clock


@dataclass(frozen=True)
class RaceConfig:
    index_dtype: IndexDtype
    gated: bool
    seed: int
    # 4 MB/s against up to 80 ms of compute per layer: copies of hundreds of ms, far above
    # the scheduling jitter of a loaded 2-core machine, so the race plays out the same way.
    # None: unthrottled (CUDA always is).
    bandwidth_bytes_per_s: float | None = 4e6
    num_requests: int = 16
    prefix_pages: int = 2
    max_layer_compute_s: float = 0.08
    topk: int = 8
    shape: ModelShape = TINY_SHAPE
    reader_timeout_s: float = 30.0
    device: str = "cpu"
    backend: str | None = None  # kernel backend; None: the device's default


@dataclass(frozen=True)
class RequestOutcome:
    stale_index_k: bool  # the indexer read keys that differ from the reference
    topk_changed: bool  # ... and picked a different top-k set on some layer
    bitwise_equal: bool  # every read (index-K, top-k, KV, compress state) matched


@dataclass(frozen=True)
class TrialResult:
    config: RaceConfig
    outcomes: tuple[RequestOutcome, ...]
    transfer_bytes: int  # what the batch load moved; / bandwidth = its duration
    # Reads the pool observed reading a page whose load had not landed (its own count).
    stale_index_k_reads: int
    stale_kv_reads: int
    blocked_reads: int  # reads that found their layer still loading and waited

    @property
    def stale(self) -> int:
        return sum(o.stale_index_k for o in self.outcomes)

    @property
    def topk_changed(self) -> int:
        return sum(o.topk_changed for o in self.outcomes)

    @property
    def mismatched(self) -> int:
        return sum(not o.bitwise_equal for o in self.outcomes)


@dataclass
class _Request:
    slot: int
    kv: dict[int, torch.Tensor]
    keys: dict[int, torch.Tensor]
    state: dict[int, torch.Tensor]
    q: torch.Tensor
    w: torch.Tensor
    compute_s: list[float]
    pages: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class _Reads:
    keys: dict[int, torch.Tensor]
    topk: dict[int, torch.Tensor]
    out: dict[int, torch.Tensor]


def _make_request(
    cfg: RaceConfig, slot: int, seed: int, compute_s: list[float], with_state: bool = True
) -> _Request:
    shape = cfg.shape
    gen = torch.Generator().manual_seed(seed)
    kv, keys, state = {}, {}, {}
    tokens = cfg.prefix_pages * shape.page_size
    for layer, ratio in enumerate(shape.compress_ratios):
        n = tokens // (ratio or 1)
        kv[layer] = torch.randn((n, shape.kv_dim), generator=gen)
        if ratio and with_state:
            state[layer] = torch.randn((ratio, shape.kv_dim), generator=gen)
        if ratio == INDEXED_RATIO:
            keys[layer] = torch.randn((n, shape.index_head_dim), generator=gen)
    # One query token's indexer heads: q [1, H, d], w [1, H].
    q = torch.randn((1, shape.index_n_heads, shape.index_head_dim), generator=gen)
    w = torch.rand((1, shape.index_n_heads), generator=gen)
    return _Request(slot, kv, keys, state, q.to(cfg.device), w.to(cfg.device), compute_s)


def _compute(seconds: float, device: torch.device) -> None:
    """A layer's compute: GPU time on the reader's stream on CUDA, wall time on CPU."""
    if device.type == "cuda":
        torch.cuda._sleep(int(seconds * GPU_CYCLES_PER_S))
    else:
        time.sleep(seconds)


def _write(pool: DevicePool, req: _Request) -> None:
    for layer, values in req.kv.items():
        locs = pool.entry_locs(layer, req.pages)
        pool.store_kv(layer, locs, values)
        if layer in req.keys:
            pool.store_index_k(layer, locs, req.keys[layer])
        if layer in req.state:
            pool.store_compress_state(layer, req.slot, req.state[layer])


def _forward(pool: DevicePool, req: _Request, topk: int, compute: bool) -> _Reads:
    """What a request's forward pass reads from the pools, layer by layer."""
    keys, top, out = {}, {}, {}
    for layer, ratio in enumerate(pool.shape.compress_ratios):
        if compute:
            _compute(req.compute_s[layer], pool.device)
        locs = pool.entry_locs(layer, req.pages)
        if ratio == INDEXED_RATIO:
            keys[layer] = pool.read_index_k(layer, locs)
            scores = pool.index_scores(layer, locs, req.q, req.w)
            top[layer] = pool.ops.topk(scores, min(topk, len(locs)))[0]
            locs = locs[top[layer]]
        kv = pool.read_kv(layer, locs).to(torch.float32)
        if ratio:
            kv = torch.cat([kv, pool.read_compress_state(layer, req.slot)])
        out[layer] = kv.sum(0)
    return _Reads(keys, top, out)


def _compare(got: _Reads, ref: _Reads) -> RequestOutcome:
    stale = any(not torch.equal(got.keys[layer], ref.keys[layer]) for layer in ref.keys)
    changed = any(
        set(got.topk[layer].tolist()) != set(ref.topk[layer].tolist()) for layer in ref.topk
    )
    equal = (
        not stale
        and all(torch.equal(got.topk[layer], ref.topk[layer]) for layer in ref.topk)
        and all(torch.equal(got.out[layer], ref.out[layer]) for layer in ref.out)
    )
    return RequestOutcome(stale, changed, equal)


def run_trial(cfg: RaceConfig) -> TrialResult:
    shape = cfg.shape
    rng = random.Random(cfg.seed)
    total_pages = cfg.num_requests * cfg.prefix_pages
    pool = DevicePool(
        shape,
        total_pages,
        cfg.index_dtype,
        max_requests=cfg.num_requests,
        device=cfg.device,
        backend=cfg.backend,
        ungated_index_k=not cfg.gated,
    )
    host = HostPool(pool.layout, total_pages, pin_memory=pool.device.type == "cuda")
    controller = TransferController(pool, host, bandwidth_bytes_per_s=cfg.bandwidth_bytes_per_s)
    cache = HiCache(pool, host, controller, HiCacheWritePolicy.WRITE_THROUGH)
    try:
        requests = []
        for slot in range(cfg.num_requests):
            compute_s = [rng.uniform(0, cfg.max_layer_compute_s) for _ in range(shape.num_layers)]
            requests.append(_make_request(cfg, slot, cfg.seed * 7919 + slot, compute_s))
        others = [
            _make_request(cfg, slot, 10**9 + cfg.seed * 7919 + slot, [], with_state=False)
            for slot in range(cfg.num_requests)
        ]
        # The no-HiCache reference: write, read once with nothing in flight, back up, evict.
        refs, host_pages = [], []
        for req in requests:
            req.pages = pool.allocator.allocate(cfg.prefix_pages)
            _write(pool, req)
            refs.append(_forward(pool, req, cfg.topk, compute=False))
            host_pages.append(cache.on_insert(req.pages))
        for req, hp in zip(requests, host_pages, strict=True):
            cache.evict(req.pages, hp)
        # Other requests reuse (and overwrite) the freed pages, then finish in random order.
        # (Compress state is per live request slot, not paged: theirs lives elsewhere.)
        for other in others:
            other.pages = pool.allocator.allocate(cfg.prefix_pages)
            _write(pool, other)
        for other in rng.sample(others, len(others)):
            pool.allocator.free(other.pages)
        # One batch loads every prefix back while every request runs its forward pass.
        flat_host = [p for hp in host_pages for p in hp]
        device_pages, load = cache.load_back(flat_host)
        for i, req in enumerate(requests):
            req.pages = device_pages[i * cfg.prefix_pages : (i + 1) * cfg.prefix_pages]
        outcomes = _run_readers(pool, requests, refs, cfg)
        load.wait_all(cfg.reader_timeout_s)
        return TrialResult(
            cfg,
            tuple(outcomes),
            len(flat_host) * pool.layout.page_bytes,
            pool.stale_reads(BufferKind.INDEX_K),
            pool.stale_reads(BufferKind.KV),
            pool.gate.blocked,
        )
    finally:
        cache.close()


def _run_readers(
    pool: DevicePool, requests: list[_Request], refs: list[_Reads], cfg: RaceConfig
) -> list[RequestOutcome]:
    outcomes: list[RequestOutcome | BaseException | None] = [None] * len(requests)

    def reader(i: int) -> None:
        try:
            outcomes[i] = _compare(_forward(pool, requests[i], cfg.topk, compute=True), refs[i])
        except BaseException as exc:  # reported below, in the caller's thread
            outcomes[i] = exc

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + cfg.reader_timeout_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        raise TimeoutError(f"race trial seed={cfg.seed}: readers still running after timeout")
    for o in outcomes:
        if isinstance(o, BaseException):
            raise o
    return [o for o in outcomes if isinstance(o, RequestOutcome)]
