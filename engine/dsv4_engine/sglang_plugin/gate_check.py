"""Proof, on SGLang's own classes, that its DeepSeek-V4 pool gates every read on HiCache.

The seed incident was an index-K read that did not wait for its layer's host→device copy.
Upstream SGLang 0.5.23 waits in each getter of ``DeepSeekV4TokenToKVPool``
(``wait_layer_transfer`` → ``LayerDoneCounter.wait_until(layer_id - start_layer)``); this
project relies on that and does not patch it.  This check keeps the reliance honest.  It
builds the real pool (small, on CPU) twice per index-K variant: holding every layer, and
as a later pipeline-parallel stage (``start_layer > 0``, where the ``- start_layer`` offset
matters).  It does not register a counter itself: it attaches HiCache to the pool through
SGLang's production assembly (``UnifiedRadixCache.init_hicache`` →
``attach_hybrid_pool_to_unified_cache``, on SGLang's real allocator and radix cache), which
registers its cache controller's ``LayerDoneCounter`` with the pool
(``hybrid_pool_assembler._apply_stack_result``, and already
``HiCacheController.__init__``).  Then, driving that controller's counter as its loads do,
it calls every buffer getter while its layer is still loading.  A getter must block until
exactly its layer's load is done.  Every other ``get_*`` method of the pool must be
classified as needing no wait, with the reason, so an SGLang bump that drops a wait or its
registration, or adds an unclassified getter, fails here.

    python -m dsv4_engine.sglang_plugin.gate_check     # exit 0: every getter waits

The engine image runs it at build time (images/engine/Dockerfile) and tests/sglang runs
it against the pinned SGLang.  Stand-ins, because they cannot exist without a GPU: CUDA
events and streams (host threads here: an event is "done" when the check completes it, a
stream's ``wait_event`` blocks the calling thread), ``cudaHostRegister`` (the host pools
stay unpinned), and a Blackwell device while SGLang resolves its server arguments.
Everything else is SGLang's code.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Generous bounds: a getter that blocks is detected as soon as it waits; these only end a
# getter that never waits for anything nor returns.
BLOCK_BOUND_S = 60.0
VARIANTS = ("fp8", "fp4")  # index-K storage SGLang 0.5.23 offers (fp4: its fp4 indexer flag)
MODEL_LAYERS = 6  # V4-Flash's first layers: SWA, SWA, c4, c128, c4, c128
ALL_RATIOS = frozenset({0, 4, 128})
PAGE = 256  # SGLang's DeepSeek-V4 page size (kv_cache_configurator: "page_size must be 256")
FULL_TOKENS = 1024  # the device pool's full-attention tokens: c128_size (8) x 128


@dataclass(frozen=True)
class Stage:
    """The layers [start, end) of the model one engine process holds."""

    start: int
    end: int

    @property
    def label(self) -> str:
        return "all layers" if self.start == 0 else f"PP stage [{self.start},{self.end})"


# Every layer on one stage, and a later pipeline-parallel stage (SGLang's PP splits layers
# into contiguous ranges): there a getter for layer L must wait for local layer L - start.
STAGES = (Stage(0, MODEL_LAYERS), Stage(2, MODEL_LAYERS))


@dataclass(frozen=True)
class Getter:
    """A pool getter the forward path reads layer data through: it must wait."""

    name: str
    ratios: frozenset[int]  # layers it applies to, by compress ratio
    returns_in: frozenset[str]  # variants where it must return (else it may raise after waiting)
    why_it_may_raise: str = ""
    args: Callable[[int], tuple[Any, ...]] = lambda layer: (layer,)


def _index_k_gather_args(layer: int) -> tuple[Any, ...]:
    import torch

    lens, pages = torch.tensor([64], dtype=torch.int32), torch.zeros((1, 1), dtype=torch.int32)
    return (layer, lens, pages, 64, 64)


def _slots_args(layer: int) -> tuple[Any, ...]:
    import torch

    return (layer, torch.arange(4))


BOTH = frozenset(VARIANTS)
MUST_WAIT = (
    Getter("get_swa_key_buffer_radix", ALL_RATIOS, BOTH),
    Getter("get_extra_key_buffer", frozenset({4, 128}), BOTH),
    Getter("get_attention_compress_states", frozenset({4, 128}), BOTH),
    Getter("get_indexer_compress_states", frozenset({4}), BOTH),
    Getter("get_index_k_with_scale_buffer", frozenset({4}), BOTH),
    Getter(
        "get_index_k_scale_buffer",
        frozenset({4}),
        frozenset(),
        "its gather is a GPU kernel",
        _index_k_gather_args,
    ),
    Getter("get_low_ratio_index_k_fp4", frozenset({4}), frozenset({"fp4"}), "fp4 rows only", _slots_args),
    Getter("get_low_ratio_index_k_dequant", frozenset({4}), frozenset({"fp4"}), "fp4 rows only", _slots_args),
    Getter("get_index_k_fp4_payload_buffer", frozenset({4}), frozenset(), "ROCm split fp4 layout only"),
    Getter("get_index_k_fp4_scale_buffer", frozenset({4}), frozenset(), "ROCm split fp4 layout only"),
    Getter("get_unified_kv", ALL_RATIOS, frozenset(), "unified KV layout only"),
    Getter("get_unified_kv_rope", ALL_RATIOS, frozenset(), "unified KV layout only"),
)  # fmt: skip
# Every other get_* of the pool, and why it needs no wait.
NO_WAIT = {
    "get_swa_raw_buffer": "store path: new tokens' SWA rows are written through it",
    "get_key_buffer": "raises NotImplementedError in this pool",
    "get_value_buffer": "raises NotImplementedError in this pool",
    "get_kv_buffer": "raises NotImplementedError in this pool",
    "get_ring_size": "layout metadata",
    "get_index_k_page_size": "layout metadata",
    "get_extra_key_page_size": "layout metadata",
    "get_extra_key_layout": "layout metadata",
    "get_extra_key_bytes_per_token": "layout metadata",
    "get_swa_key_layout": "layout metadata",
    "get_swa_key_page_size": "layout metadata",
    "get_swa_key_bytes_per_token": "layout metadata",
    "get_contiguous_buf_infos": "buffer addresses for PD/HiCache registration, not contents",
    "get_state_buf_infos": "buffer addresses for PD/HiCache registration, not contents",
    "get_request_state_buf_infos": "buffer addresses for PD registration, not contents",
    "get_swa_valid_from_buf_infos": "buffer addresses for PD registration, not contents",
    "get_unified_swa_ring_buf_infos": "buffer addresses for PD registration, not contents",
    "get_online_c128_mtp_state_slot_offset": "request-slot bookkeeping, not loaded pages",
    "get_online_c128_mtp_max_draft_tokens": "request-slot bookkeeping, not loaded pages",
    "get_online_c128_state_num_req_slots": "request-slot bookkeeping, not loaded pages",
    "get_online_c128_mtp_pending_seq_lens": "request-slot bookkeeping, not loaded pages",
}


@dataclass(frozen=True)
class Outcome:
    getter: str
    variant: str
    stage: str
    layer: int
    ok: bool
    detail: str


# -- stand-ins for CUDA events and streams --------------------------------------------


class _Board:
    """Shared state of the stand-in events: which are done, which thread waits on which."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.waiting: dict[int, FakeCudaEvent] = {}
        self.waited: dict[int, list[FakeCudaEvent]] = {}

    def block_until_done(self, event: FakeCudaEvent) -> None:
        me = threading.get_ident()
        with self.cond:
            self.waiting[me] = event
            self.waited.setdefault(me, []).append(event)
            self.cond.notify_all()
            done = self.cond.wait_for(lambda: event.done, BLOCK_BOUND_S)
            del self.waiting[me]
        if not done:
            raise TimeoutError(f"stand-in CUDA event not completed within {BLOCK_BOUND_S}s")

    def set_done(self, events: list[FakeCudaEvent], done: bool) -> None:
        with self.cond:
            for event in events:
                event.done = done
            self.cond.notify_all()


class FakeCudaEvent:
    """Stands in for a CUDA event (none exists without a GPU): `record()` marks the work
    before it finished, `query()` says so, a stream waiting on it blocks the thread."""

    def __init__(self, board: _Board, **_: Any) -> None:
        self.board = board
        self.done = True  # a CUDA event never recorded counts as complete

    def record(self, stream: Any = None) -> None:
        self.board.set_done([self], True)

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.board.block_until_done(self)

    def wait(self, stream: Any = None) -> None:
        self.board.block_until_done(self)


class FakeCudaStream:
    """Stands in for the current CUDA stream: `wait_event` blocks the calling thread."""

    def __init__(self, board: _Board) -> None:
        self.board = board

    def wait_event(self, event: FakeCudaEvent) -> None:
        self.board.block_until_done(event)


class FakeCudaDeviceModule:
    """Stands in for `torch.cuda` where SGLang's cache controller builds its events."""

    def __init__(self, board: _Board) -> None:
        self.board = board

    def Event(self, **kwargs: Any) -> FakeCudaEvent:  # noqa: N802 (torch.cuda.Event)
        return FakeCudaEvent(self.board, **kwargs)

    def current_stream(self, device: Any = None) -> FakeCudaStream:
        return FakeCudaStream(self.board)


# -- building SGLang's pool ------------------------------------------------------------


@contextlib.contextmanager
def _fake_blackwell_device() -> Iterator[None]:
    """While SGLang resolves server arguments: a Blackwell (SM100) device stands in for the
    GPU this machine lacks (the fp4 indexer flag requires one)."""
    import torch
    from sglang.srt.runtime_context import override_platform

    saved = torch.cuda.get_device_capability
    torch.cuda.get_device_capability = lambda *a, **k: (10, 0)
    try:
        with override_platform(is_sm100=True, is_blackwell=True):
            yield
    finally:
        torch.cuda.get_device_capability = saved


@contextlib.contextmanager
def _fake_cuda_host_register() -> Iterator[None]:
    """While SGLang builds its HiCache host pools: ``cudaHostRegister`` (pinning them for
    DMA) needs a CUDA driver this machine lacks, so they stay plain host memory."""
    from sglang.srt.mem_cache.pool_host import common

    def fake_cuda_host_register(buffer: Any, registration_granularity_bytes: Any = None) -> None:
        """Pins nothing: no copy to a device ever reads these pools here."""

    saved = common._cuda_host_register
    common._cuda_host_register = fake_cuda_host_register
    try:
        yield
    finally:
        common._cuda_host_register = saved


def _publish(model_dir: Path, variant: str) -> Any:
    """Publish (and return) SGLang's server arguments for `variant`, HiCache on."""
    from sglang.srt import runtime_context
    from sglang.srt.server_args import ServerArgs

    with _fake_blackwell_device():
        args = ServerArgs(
            model_path=str(model_dir),
            device="cuda",
            chunked_prefill_size=8192,
            enable_deepseek_v4_fp4_indexer=variant == "fp4",
            enable_hierarchical_cache=True,
        )
        runtime_context.publish(args, role="scheduler")
    return args


def build_pool(config: dict[str, Any], ratios: list[int], stage: Stage) -> Any:
    """SGLang's DeepSeek-V4 pool of `stage` for the published arguments, a few pages, on CPU,
    with the layer range SGLang's KV-cache configurator gives it (``_build_dsv4_kv_pool``:
    the whole model's ratios, the stage's start and end layer, its layer count)."""
    import torch
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool

    rope = int(config["qk_rope_head_dim"])
    return DeepSeekV4TokenToKVPool(
        max_num_reqs=2,
        swa_size=512,
        c4_size=256,
        c128_size=FULL_TOKENS // 128,
        c4_state_pool_size=64,
        c128_state_pool_size=512,
        page_size=PAGE,
        swa_page_size=PAGE,
        dtype=torch.float8_e4m3fn,
        c4_state_dtype=torch.float32,
        c128_state_dtype=torch.float32,
        qk_nope_head_dim=int(config["head_dim"]) - rope,
        qk_rope_head_dim=rope,
        indexer_head_dim=int(config["index_head_dim"]),
        layer_num=stage.end - stage.start,
        device="cpu",
        enable_memory_saver=False,
        compression_ratios=ratios,
        sliding_window=int(config["sliding_window"]),
        start_layer=stage.start,
        end_layer=stage.end,
    )


def attach_hicache(pool: Any, args: Any, config: dict[str, Any]) -> Any:
    """Attach HiCache to `pool` the way a DeepSeek-V4 engine does, and return the layer
    counter SGLang's loads record into.

    SGLang's path (``mem_cache/registry.py`` ``create_unified_radix_cache``): a
    ``UnifiedRadixCache`` with FULL and SWA components over the pool's allocator, then its
    ``init_hicache``, which builds the host pools and cache controller and registers the
    controller's ``LayerDoneCounter`` with the pool.  The returned counter is that
    controller's: ``start_loading`` marks each layer's copy done on it, and the same object
    goes to the TP worker, whose ``set_hicache_consumer`` picks the load a batch waits on.
    Nothing here registers a counter: a pool SGLang left unwired fails the check."""
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    allocator = SWATokenToKVPoolAllocator(
        FULL_TOKENS,
        pool.swa_size,
        page_size=PAGE,
        dtype=pool.dtype,
        device="cpu",
        kvcache=pool,
        need_sort=False,
    )
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=ReqToTokenPool(
            size=2, max_context_len=FULL_TOKENS, device="cpu", enable_memory_saver=False
        ),
        token_to_kv_pool_allocator=allocator,
        page_size=PAGE,
        sliding_window_size=int(config["sliding_window"]),
        tree_components=(ComponentType.FULL, ComponentType.SWA),
    )
    cache = UnifiedRadixCache(params)
    with _fake_cuda_host_register():
        cache.init_hicache(args, params)
    return cache.cache_controller.layer_done_counter


def wiring_problems(pool: Any, counter: Any, variant: str, stage: Stage) -> list[str]:
    """A message when SGLang's assembly left the pool without its controller's counter:
    then no getter can wait for a load (each getter outcome says so too)."""
    held = pool.layer_transfer_counter
    if held is counter:
        return []
    holds = "none" if held is None else "another LayerDoneCounter, which no load records into"
    return [
        f"{variant} {stage.label}: SGLang's HiCache assembly left the pool without its cache "
        f"controller's LayerDoneCounter (the pool holds {holds})"
    ]


# -- the check -------------------------------------------------------------------------


def _describe(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"returned {str(value.dtype).removeprefix('torch.')} {list(shape)}"
    if isinstance(value, tuple):
        return "returned (" + ", ".join(_describe(v).removeprefix("returned ") for v in value) + ")"
    return f"returned a {type(value).__name__}"


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class _Call:
    """One getter call on its own thread, observable through the board."""

    def __init__(self, board: _Board, fn: Callable[[], Any]) -> None:
        self.board = board
        self.value: Any = None
        self.error: BaseException | None = None
        self.finished = False
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)

    def _run(self, fn: Callable[[], Any]) -> None:
        with self.board.cond:  # a finished call's thread id is reused: start its record anew
            self.board.waited.pop(threading.get_ident(), None)
        try:
            self.value = fn()
        except BaseException as exc:  # reported as the getter's outcome
            self.error = exc
        with self.board.cond:
            self.finished = True
            self.board.cond.notify_all()

    def start_and_settle(self) -> FakeCudaEvent | None:
        """Start; return the event it blocks on, or None once it finished without blocking."""
        self.thread.start()
        with self.board.cond:
            settled = self.board.cond.wait_for(
                lambda: self.finished or self.thread.ident in self.board.waiting, BLOCK_BOUND_S
            )
            if not settled:
                raise TimeoutError("getter neither blocked nor returned")
            return None if self.finished else self.board.waiting[self.thread.ident]

    def join(self) -> bool:
        with self.board.cond:
            return self.board.cond.wait_for(lambda: self.finished, BLOCK_BOUND_S)

    def waited_layers(self, events: list[FakeCudaEvent], start: int) -> list[int | str]:
        """The layers (model numbering: stage-local index + `start`) whose load it waited for."""
        return [
            start + events.index(e) if e in events else "another event"
            for e in self.board.waited.get(self.thread.ident or -1, [])
        ]


@dataclass(frozen=True)
class Wired:
    """One pool as SGLang's HiCache assembly left it, and the counter its loads record into."""

    pool: Any
    counter: Any
    variant: str
    stage: Stage


def check_getter(wired: Wired, board: _Board, getter: Getter, layer: int) -> Outcome:
    """Call `getter` on model layer `layer` while a load has finished the stage's layers
    before it only (the counter numbers a stage's layers from 0: ``layer - start_layer``)."""
    counter, start = wired.counter, wired.stage.start
    slot = counter.update_producer()  # SGLang: the slot's previous load must have finished
    load = counter.events[slot]
    board.set_done(load.load_events, False)  # the load's copies are queued, none finished
    counter.set_consumer(slot)  # the batch that reads the pages waits on this load
    for before in range(layer - start):
        load.complete(before)  # SGLang's on_layer_done: the copy of that layer finished
    call = _Call(board, lambda: getattr(wired.pool, getter.name)(*getter.args(layer)))

    def outcome(ok: bool, detail: str) -> Outcome:
        return Outcome(getter.name, wired.variant, wired.stage.label, layer, ok, detail)

    try:
        blocked_on = call.start_and_settle()
        waited = call.waited_layers(load.load_events, start)
        if blocked_on is None and call.error is not None:
            return outcome(
                False, f"raised {_error(call.error)} before layer {layer}'s load finished"
            )
        if blocked_on is None:
            return outcome(
                False, f"returned before layer {layer}'s load finished (waited: {waited})"
            )
        if blocked_on is not load.load_events[layer - start]:
            return outcome(False, f"waited for layer {waited[-1]}, not layer {layer}")
        load.complete(layer - start)
        if not call.join():
            return outcome(False, f"still blocked after layer {layer}'s load finished")
    finally:
        board.set_done(load.load_events, True)  # the load ends; nothing stays blocked
        counter.set_consumer(-1)
    if call.error is None:
        return outcome(True, f"waited for layer {layer}, then {_describe(call.value)}")
    if wired.variant in getter.returns_in:
        return outcome(False, f"waited for layer {layer}, then raised {_error(call.error)}")
    return outcome(
        True,
        f"waited for layer {layer}, then raised {type(call.error).__name__} "
        f"({getter.why_it_may_raise})",
    )


def unclassified_getters() -> list[str]:
    """Messages for get_* methods of the pool this check does not know, or no longer finds."""
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool

    present = {
        name
        for name, value in vars(DeepSeekV4TokenToKVPool).items()
        if name.startswith("get_") and callable(value)
    }
    known = {g.name for g in MUST_WAIT} | set(NO_WAIT)
    return [
        *(f"{n}: a getter this check does not classify (must it wait?)" for n in sorted(present - known)),
        *(f"{n}: listed here but SGLang's pool no longer has it" for n in sorted(known - present)),
    ]  # fmt: skip


def check_stage(wired: Wired, board: _Board, ratios: list[int]) -> list[Outcome]:
    """Every getter on every layer of the stage it applies to."""
    return [
        check_getter(wired, board, getter, layer)
        for getter in MUST_WAIT
        for layer in range(wired.stage.start, wired.stage.end)
        if ratios[layer] in getter.ratios
    ]


def run_check() -> tuple[list[Outcome], list[str]]:
    """(every getter × applicable layer × stage × variant, wiring and classification
    problems)."""
    from sglang.srt.managers import cache_controller

    from dsv4_engine.presets import preset_config

    config = preset_config("v4-flash")
    ratios = [int(r) for r in config["compress_ratios"][:MODEL_LAYERS]]
    board = _Board()
    cache_controller.device_module = FakeCudaDeviceModule(board)  # no CUDA here
    outcomes: list[Outcome] = []
    problems: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        for variant in VARIANTS:
            args = _publish(Path(tmp), variant)
            for stage in STAGES:
                pool = build_pool(config, ratios, stage)
                wired = Wired(pool, attach_hicache(pool, args, config), variant, stage)
                problems += wiring_problems(pool, wired.counter, variant, stage)
                outcomes += check_stage(wired, board, ratios)
    return outcomes, problems + unclassified_getters()


def report(outcomes: list[Outcome], problems: list[str]) -> int:
    """Print every outcome; the exit status: 0 when every getter waited, else 1."""
    import sglang

    for o in outcomes:
        mark = "ok  " if o.ok else "FAIL"
        print(f"{mark} {o.getter:34} {o.variant} {o.stage}, layer {o.layer}: {o.detail}")
    for name, why in sorted(NO_WAIT.items()):
        print(f"--   {name:34} needs no wait: {why}")
    failed = [o for o in outcomes if not o.ok]
    for problem in problems:
        print(f"FAIL {problem}")
    if failed or problems:
        print(
            f"gate check: SGLang {sglang.__version__}'s DeepSeek-V4 pool does NOT gate every "
            f"read on HiCache loads ({len(failed)} getter calls, {len(problems)} "
            "wiring or classification problems)"
        )
        return 1
    print(
        f"gate check: SGLang {sglang.__version__}: every DeepSeek-V4 pool getter waits for its "
        f"layer's HiCache load ({len(outcomes)} getter calls)"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    return report(*run_check())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
