"""The scheduler: one thread owns the model, the pools and the prefix cache.

Continuous batching: each step admits waiting requests (matching their prompts against
the prefix cache and starting ONE host→device load for every page they need back), then
runs one forward: a page-aligned chunk of every request still in prefill or, when none
is, one decode token of every running request.  Requests finish independently and leave their full pages in the cache.

How far a forward shares work across its batch is the model's call, bounded by one rule:
a request's answer must not depend on the rest of its batch (warm answers equal cold ones
bit for bit, which the consistency probe relies on).  The echo model computes on small
integers, exact in any batch shape, so it reads the pools once per layer for the whole
batch, its copy heads' lookups included; the random model batches its one-token chunks
with ops that compute every row on shapes of its own (a batched matmul may round a row
differently with the batch's shape) and computes each prefill chunk on its own tensors.

HTTP handlers talk to it only through `submit` / `call` (thread-safe); results come back
through each request's callbacks, called on the engine thread.
"""

from __future__ import annotations

import logging
import math
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from dsv4_engine.hicache.cache import HiCache
from dsv4_engine.pools.allocator import OutOfPages
from dsv4_engine.pools.device_pool import DevicePool
from dsv4_engine.pools.gate import TransferFailed, TransferTimeout
from dsv4_engine.pools.layout import BufferKind
from dsv4_engine.reference import tokenizer
from dsv4_engine.reference.metrics import EngineStats
from dsv4_engine.reference.model import Chunk
from dsv4_engine.reference.models import load_model
from dsv4_engine.reference.radix import Node, RadixCache
from dsv4_engine.reference.settings import DisaggregationMode, ServeSettings

logger = logging.getLogger(__name__)
CACHE_STATS_PERIOD_S = 0.25


@dataclass
class PrefilledState:
    """What a prefill server hands over: the first token, the prompt's pool contents and
    how much of the prompt its prefix cache held (device and host tier), which the decode
    server reports as its own answer's (as SGLang's decode reads the prefill's counts from
    the transfer's metadata, `disaggregation/decode.py`)."""

    first_token: int
    pages: dict[tuple[int, str], bytes]  # (layer, kind) -> page rows, in page order
    compress_state: dict[int, bytes]  # layer -> float32 [ratio, kv_dim]
    cached_tokens: int = 0
    host_tokens: int = 0


@dataclass(eq=False)
class Request:
    prompt: list[int]
    max_new_tokens: int
    on_token: Callable[[int], None]
    on_done: Callable[[str, str | None], None]  # (finish reason, error or None)
    prefill_only: bool = False  # PD prefill: stop after the first token, export the pages
    prefilled: PrefilledState | None = None  # PD decode: import these pages, then decode
    on_exported: Callable[[PrefilledState], None] | None = None
    # scheduler state
    nodes: list[Node] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)
    slot: int = -1
    computed: int = 0
    output: list[int] = field(default_factory=list)
    cached_tokens: int = 0
    host_tokens: int = 0
    """Of `cached_tokens`, those this request loaded back from the host tier (the pages its
    admission started a host→device load for): SGLang's `Req.cached_tokens_host`."""
    locs: dict[int, torch.Tensor] = field(default_factory=dict)
    flips: bool = False
    """Its first token takes the runner-up (`ServeSettings.benign_nondeterminism`)."""


class Engine:
    def __init__(self, settings: ServeSettings) -> None:
        torch.set_num_threads(1)  # one fixed reduction order, and two cores are shared
        self.settings = settings
        self.model = load_model(settings.reference_model, settings.page_size, settings.random_seed)
        shape = self.model.shape
        self.pool = DevicePool(
            shape,
            settings.device_pages,
            settings.index_dtype,
            max_requests=settings.max_running_requests,
        )
        feature = settings.hicache_feature
        self.hicache: HiCache | None = None
        if feature is not None:
            bandwidth = settings.hicache_bandwidth_mb_s * 1e6 or None
            self.hicache = HiCache.build(
                self.pool,
                feature,
                bandwidth_bytes_per_s=bandwidth,
                layer_latency_s=settings.hicache_layer_latency_ms / 1e3,
            )
        self.radix = RadixCache(self.pool.allocator, settings.page_size, self.hicache)
        # A decode server never matches a prompt (its pages come from the prefill server),
        # so caching its requests' pages would only cost a host backup per request.
        self._caches_prefixes = settings.disaggregation_mode is not DisaggregationMode.DECODE
        self.stats = EngineStats()
        self._inbox: queue.Queue[Any] = queue.Queue()
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self._free_slots = list(range(settings.max_running_requests - 1, -1, -1))
        self._stop = threading.Event()
        self._cache_stats_due = 0.0
        self._noise = random.Random(settings.random_seed)  # which cache hits flip
        self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)

    @property
    def page_size(self) -> int:
        return self.settings.page_size

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._inbox.put(None)
        self._thread.join(timeout=30)
        if self.hicache is not None:
            self.hicache.close()

    def check_fits(self, prompt_len: int, max_new_tokens: int) -> str | None:
        """Why a request can never run here, or None."""
        total = prompt_len + max_new_tokens
        if total > self.settings.context_length:
            return (
                f"prompt ({prompt_len} tokens) + max_tokens ({max_new_tokens}) exceeds "
                f"--context-length {self.settings.context_length}"
            )
        if math.ceil(total / self.page_size) > self.settings.device_pages:
            return f"request needs more than --max-total-tokens {self.settings.max_total_tokens}"
        return None

    def submit(self, req: Request) -> None:
        self._inbox.put(req)

    def call(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run `fn` on the engine thread between two steps."""
        fut: Future[Any] = Future()
        self._inbox.put((fn, fut))
        return fut

    def offload(self) -> int:
        """Push every cached prefix not in use to the host tier; tokens offloaded.
        Engine thread only (`call` it): it also counts them in `stats`."""
        tokens = self.radix.offload_all()
        self.stats.offloaded_tokens += tokens
        return tokens

    # -- the loop -------------------------------------------------------------------------

    def _loop(self) -> None:
        # Serving never differentiates: inference mode skips the autograd bookkeeping
        # (version counters, view tracking) of every small op, ~14% of a step's CPU.
        with torch.inference_mode():
            while not self._stop.is_set():
                self._drain(block=not (self._running or self._waiting))
                try:
                    self._admit()
                    if self._running:
                        self._step()
                except Exception as exc:  # never leave clients hanging on a dead engine
                    logger.exception("engine step failed")
                    for req in list(self._running):
                        self._finish(req, "abort", f"engine error: {exc}")
                self.stats.running = len(self._running)
                self.stats.queued = len(self._waiting)
                now = time.monotonic()
                if now >= self._cache_stats_due or not (self._running or self._waiting):
                    # A walk of the whole prefix tree: a few times a second, not every step.
                    self.stats.set_cache(
                        *self.radix.cached_tokens(), self.pool.allocator.free_pages
                    )
                    self._cache_stats_due = now + CACHE_STATS_PERIOD_S

    def _drain(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if isinstance(item, Request):
                self._waiting.append(item)
                self.stats.queued = len(self._waiting)
            elif isinstance(item, tuple):
                fn, fut = item
                try:
                    fut.set_result(fn())
                except Exception as exc:
                    fut.set_exception(exc)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _admit(self) -> None:
        to_load: list[Node] = []
        try:
            while self._waiting and self._free_slots:
                req = self._waiting[0]
                try:
                    to_load += self._reserve(req)
                except OutOfPages:
                    break  # wait for running requests to free pages
                self._waiting.popleft()
                req.slot = self._free_slots.pop()
                self._running.append(req)
                if req.prefilled is not None:
                    self._import(req, req.prefilled)
        finally:  # even when admitting a later request failed: these pages are in the tree
            self._start_load(to_load)

    def _start_load(self, nodes: list[Node]) -> None:
        """Start the step's one host→device load.  If it cannot start, the device pages
        reserved for it go back and its nodes keep only their host copies: a node must
        never claim a device page nothing was loaded into (a later match would read its
        previous owner's KV), and the loop then ends the requests admitted with them."""
        try:
            self.radix.load(nodes)
        except Exception:
            self.radix.cancel_load(nodes)
            raise
        self.stats.load_back_tokens += len(nodes) * self.page_size

    def _reserve(self, req: Request) -> list[Node]:
        total_pages = math.ceil((len(req.prompt) + req.max_new_tokens) / self.page_size)
        nodes: list[Node] = []
        if req.prefilled is None:  # the last prompt token is always computed (its logits)
            nodes = self.radix.match(req.prompt, (len(req.prompt) - 1) // self.page_size)
        on_host = self.radix.acquire(nodes)
        try:
            self.radix.ensure_free(total_pages - len(nodes))
            fresh = self.pool.allocator.allocate(total_pages - len(nodes))
        except Exception:  # OutOfPages, or a bug: never leave a reserved page unloaded
            self.radix.cancel_load(on_host)  # give back the device pages reserved for it
            self.radix.release(nodes)
            raise
        req.nodes = nodes
        req.pages = [n.device_page for n in nodes] + fresh  # type: ignore[misc]
        req.computed = req.cached_tokens = len(nodes) * self.page_size
        req.host_tokens = len(on_host) * self.page_size
        share = self.settings.benign_nondeterminism
        req.flips = bool(share and nodes) and self._noise.random() < share
        self.stats.count_prompt(len(req.prompt), req.cached_tokens)
        return on_host

    def _step(self) -> None:
        # Prefill batches first, decode batches otherwise (SGLang's default, no mixed
        # chunks): a batch that loads prefixes from host computes only the new requests.
        batch = [r for r in self._running if r.computed < len(r.prompt)] or list(self._running)
        chunks = [self._next_chunk(req) for req in batch]
        try:
            tokens = self.model.forward(self.pool, chunks)
        except (TransferFailed, TransferTimeout) as err:
            # The failed load's pages are never read again: its requests end with the
            # error, its nodes drop their device copies, and only then the gate lets go.
            self.stats.transfer_failures += 1
            for req in batch:
                self._finish(req, "abort", f"HiCache load failed: {err}")
            for load in self.radix.drop_failed_loads():
                self.pool.gate.discard(load)
            return
        for req, chunk, token in zip(batch, chunks, tokens, strict=True):
            req.locs = chunk.locs
            req.computed = chunk.end
            if req.computed < len(req.prompt):
                continue
            req.output.append(token)
            self.stats.generation_tokens += 1
            if token == tokenizer.EOS_ID and not req.prefill_only:
                self._finish(req, "stop", None)  # end of turn: not part of the text
                continue
            req.on_token(token)
            if req.prefill_only or len(req.output) >= req.max_new_tokens:
                self._finish(req, "length", None)

    def _next_chunk(self, req: Request) -> Chunk:
        if req.computed < len(req.prompt):
            end = min(len(req.prompt), (req.computed // self.page_size + 1) * self.page_size)
            tokens = req.prompt[req.computed : end]
        else:
            tokens = [req.output[-1]]
        first = not req.output and req.computed + len(tokens) >= len(req.prompt)
        return Chunk(tokens, req.computed, req.pages, req.slot, req.locs, req.flips and first)

    def _finish(self, req: Request, reason: str, error: str | None) -> None:
        self._running.remove(req)
        self._free_slots.append(req.slot)
        if error is None and req.prefill_only and req.on_exported is not None:
            req.on_exported(self._export(req))
        if error is None and self._caches_prefixes:
            with_kv = req.prompt + req.output[:-1]
            full = min(len(with_kv) // self.page_size, len(req.pages))
            spare = self.radix.insert(with_kv[: full * self.page_size], req.pages[:full])
            self.radix.release(req.nodes)
            self.pool.allocator.free(spare + req.pages[full:])
        else:
            self.radix.release(req.nodes)
            self.pool.allocator.free(req.pages[len(req.nodes) :])
        self.stats.finished += 1
        req.on_done(reason, error)

    # -- PD: the pool contents of a prompt, out and in ----------------------------------

    def _prompt_rows(self, req: Request) -> torch.Tensor:
        """Pool rows of the pages holding the prompt, in page order: what PD moves."""
        n_pages = math.ceil(len(req.prompt) / self.page_size)
        return torch.tensor(req.pages[:n_pages], dtype=torch.int64)

    def _export(self, req: Request) -> PrefilledState:
        rows = self._prompt_rows(req)
        pages = {
            (layer, kind.value): self.pool.buffer(layer, kind)[rows].numpy().tobytes()
            for layer, kind in self.pool.buffer_kinds()
            if kind is not BufferKind.COMPRESS_STATE
        }
        state = {
            layer: self.pool.read_compress_state(layer, req.slot).numpy().tobytes()
            for layer, ratio in enumerate(self.pool.shape.compress_ratios)
            if ratio
        }
        return PrefilledState(req.output[0], pages, state, req.cached_tokens, req.host_tokens)

    def _import(self, req: Request, state: PrefilledState) -> None:
        rows = self._prompt_rows(req)
        for (layer, kind), data in state.pages.items():
            buf = self.pool.buffer(layer, BufferKind(kind))
            buf[rows] = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(len(rows), -1)
        shape = self.pool.shape
        for layer, data in state.compress_state.items():
            ratio = shape.compress_ratios[layer]
            tensor = torch.frombuffer(bytearray(data), dtype=torch.float32)
            self.pool.store_compress_state(layer, req.slot, tensor.view(ratio, shape.kv_dim))
        req.computed = len(req.prompt)
        req.cached_tokens, req.host_tokens = state.cached_tokens, state.host_tokens
        req.output = [state.first_token]
        req.on_token(state.first_token)
