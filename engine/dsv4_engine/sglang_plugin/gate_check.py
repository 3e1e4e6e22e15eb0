"""Proof, on SGLang's own classes, that its DeepSeek-V4 pool gates every read on HiCache.

The seed incident was an index-K read that did not wait for its layer's host→device copy.
Upstream SGLang 0.5.23 waits in each getter of ``DeepSeekV4TokenToKVPool``
(``wait_layer_transfer`` → ``LayerDoneCounter.wait_until``); this project relies on that
and does not patch it.  This check keeps the reliance honest: it builds the real pool
(small, on CPU), registers a real ``LayerDoneCounter`` whose per-layer events are driven
by hand, and calls every buffer getter while its layer is still loading.  A getter must
block until exactly its layer's load is done.  Every other ``get_*`` method of the pool
must be classified as needing no wait, with the reason, so an SGLang bump that drops a
wait or adds an unclassified getter fails here.

    python -m dsv4_engine.sglang_plugin.gate_check     # exit 0: every getter waits

The engine image runs it at build time (images/engine/Dockerfile) and tests/sglang runs
it against the pinned SGLang.  Stand-ins, because they cannot exist without a GPU: CUDA
events and streams (host threads here: an event is "done" when the check completes it, a
stream's ``wait_event`` blocks the calling thread), and a Blackwell device while SGLang
resolves its server arguments.  Everything else is SGLang's code.
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
STAGE_LAYERS = 6  # V4-Flash's first layers: SWA, SWA, c4, c128, c4, c128
ALL_RATIOS = frozenset({0, 4, 128})


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
    layer: int
    ok: bool
    detail: str


# -- stand-ins for CUDA events and streams --------------------------------------------


class _Board:
    """Shared state of the stand-in events: which are done, which thread waits on which."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.waiting: dict[int, HostThreadEvent] = {}
        self.waited: dict[int, list[HostThreadEvent]] = {}

    def block_until_done(self, event: HostThreadEvent) -> None:
        me = threading.get_ident()
        with self.cond:
            self.waiting[me] = event
            self.waited.setdefault(me, []).append(event)
            self.cond.notify_all()
            done = self.cond.wait_for(lambda: event.done, BLOCK_BOUND_S)
            del self.waiting[me]
        if not done:
            raise TimeoutError(f"stand-in CUDA event not completed within {BLOCK_BOUND_S}s")

    def set_done(self, events: list[HostThreadEvent], done: bool) -> None:
        with self.cond:
            for event in events:
                event.done = done
            self.cond.notify_all()


class HostThreadEvent:
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


class HostThreadStream:
    """Stands in for the current CUDA stream: `wait_event` blocks the calling thread."""

    def __init__(self, board: _Board) -> None:
        self.board = board

    def wait_event(self, event: HostThreadEvent) -> None:
        self.board.block_until_done(event)


class HostThreadDeviceModule:
    """Stands in for `torch.cuda` where SGLang's cache controller builds its events."""

    def __init__(self, board: _Board) -> None:
        self.board = board

    def Event(self, **kwargs: Any) -> HostThreadEvent:  # noqa: N802 (torch.cuda.Event)
        return HostThreadEvent(self.board, **kwargs)

    def current_stream(self, device: Any = None) -> HostThreadStream:
        return HostThreadStream(self.board)


# -- building SGLang's pool ------------------------------------------------------------


@contextlib.contextmanager
def _blackwell_without_gpu() -> Iterator[None]:
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


def _publish(model_dir: Path, variant: str) -> None:
    from sglang.srt import runtime_context
    from sglang.srt.server_args import ServerArgs

    with _blackwell_without_gpu():
        args = ServerArgs(
            model_path=str(model_dir),
            device="cuda",
            chunked_prefill_size=8192,
            enable_deepseek_v4_fp4_indexer=variant == "fp4",
        )
        runtime_context.publish(args, role="scheduler")


def build_pool(config: dict[str, Any], ratios: list[int]) -> Any:
    """SGLang's DeepSeek-V4 pool for the published arguments, a few pages, on CPU."""
    import torch
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool

    rope = int(config["qk_rope_head_dim"])
    return DeepSeekV4TokenToKVPool(
        max_num_reqs=2,
        swa_size=512,
        c4_size=256,
        c128_size=8,
        c4_state_pool_size=64,
        c128_state_pool_size=512,
        page_size=256,
        swa_page_size=256,
        dtype=torch.float8_e4m3fn,
        c4_state_dtype=torch.float32,
        c128_state_dtype=torch.float32,
        qk_nope_head_dim=int(config["head_dim"]) - rope,
        qk_rope_head_dim=rope,
        indexer_head_dim=int(config["index_head_dim"]),
        layer_num=len(ratios),
        device="cpu",
        enable_memory_saver=False,
        compression_ratios=ratios,
        sliding_window=int(config["sliding_window"]),
    )


# -- the check -------------------------------------------------------------------------


def _describe(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"returned {str(value.dtype).removeprefix('torch.')} {list(shape)}"
    if isinstance(value, tuple):
        return "returned (" + ", ".join(_describe(v).removeprefix("returned ") for v in value) + ")"
    return f"returned a {type(value).__name__}"


class _Call:
    """One getter call on its own thread, observable through the board."""

    def __init__(self, board: _Board, fn: Callable[[], Any]) -> None:
        self.board = board
        self.value: Any = None
        self.error: BaseException | None = None
        self.finished = False
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            self.value = fn()
        except BaseException as exc:  # reported as the getter's outcome
            self.error = exc
        with self.board.cond:
            self.finished = True
            self.board.cond.notify_all()

    def start_and_settle(self) -> HostThreadEvent | None:
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

    def waited_layers(self, events: list[HostThreadEvent]) -> list[int | str]:
        return [
            events.index(e) if e in events else "another event"
            for e in self.board.waited.get(self.thread.ident or -1, [])
        ]


def check_getter(
    pool: Any, counter: Any, board: _Board, getter: Getter, layer: int, variant: str
) -> Outcome:
    """Call `getter` on `layer` while a load has finished the layers before it only."""
    slot = counter.update_producer()  # SGLang: the slot's previous load must have finished
    load = counter.events[slot]
    board.set_done(load.load_events, False)  # the load's copies are queued, none finished
    counter.set_consumer(slot)  # the batch that reads the pages waits on this load
    for before in range(layer):
        load.complete(before)  # SGLang's on_layer_done: the copy of that layer finished
    call = _Call(board, lambda: getattr(pool, getter.name)(*getter.args(layer)))

    def outcome(ok: bool, detail: str) -> Outcome:
        return Outcome(getter.name, variant, layer, ok, detail)

    try:
        blocked_on = call.start_and_settle()
        if blocked_on is None:
            waited = call.waited_layers(load.load_events)
            return outcome(
                False, f"returned before layer {layer}'s load finished (waited: {waited})"
            )
        if blocked_on is not load.load_events[layer]:
            which = call.waited_layers(load.load_events)[-1]
            return outcome(False, f"waited for layer {which}, not layer {layer}")
        load.complete(layer)
        if not call.join():
            return outcome(False, f"still blocked after layer {layer}'s load finished")
    finally:
        board.set_done(load.load_events, True)  # the load ends; nothing stays blocked
        counter.set_consumer(-1)
    if call.error is None:
        return outcome(True, f"waited for layer {layer}, then {_describe(call.value)}")
    raised = f"{type(call.error).__name__}: {call.error}"
    if variant in getter.returns_in:
        return outcome(False, f"waited for layer {layer}, then raised {raised}")
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


def run_check() -> tuple[list[Outcome], list[str]]:
    """(every getter × applicable layer × variant, classification problems)."""
    from sglang.srt.managers import cache_controller

    from dsv4_engine.presets import preset_config

    config = preset_config("v4-flash")
    ratios = [int(r) for r in config["compress_ratios"][:STAGE_LAYERS]]
    board = _Board()
    cache_controller.device_module = HostThreadDeviceModule(board)  # no CUDA here
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        for variant in VARIANTS:
            _publish(Path(tmp), variant)
            pool = build_pool(config, ratios)
            counter = cache_controller.LayerDoneCounter(len(ratios))
            pool.register_layer_transfer_counter(counter)
            for getter in MUST_WAIT:
                for layer, ratio in enumerate(ratios):
                    if ratio in getter.ratios:
                        outcomes.append(check_getter(pool, counter, board, getter, layer, variant))
    return outcomes, unclassified_getters()


def report(outcomes: list[Outcome], problems: list[str]) -> int:
    """Print every outcome; the exit status: 0 when every getter waited, else 1."""
    import sglang

    for o in outcomes:
        mark = "ok  " if o.ok else "FAIL"
        print(f"{mark} {o.getter:34} {o.variant} layer {o.layer}: {o.detail}")
    for name, why in sorted(NO_WAIT.items()):
        print(f"--   {name:34} needs no wait: {why}")
    failed = [o for o in outcomes if not o.ok]
    for problem in problems:
        print(f"FAIL {problem}")
    if failed or problems:
        print(
            f"gate check: SGLang {sglang.__version__}'s DeepSeek-V4 pool does NOT gate every "
            f"read on HiCache loads ({len(failed)} getter calls, {len(problems)} "
            "classification problems)"
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
