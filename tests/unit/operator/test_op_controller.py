"""The reconcile loop (`reconcile.controller`): events coalesce into passes, passes are
bounded, the operator's own status write wakes nothing, a pass waits for the cache to show
its deployment's last writes, and a deadline wakes a deployment without any event.

The passes here are stand-ins that record when they run (the real pass is covered by the
harness tests); the queue, the timers and the thread pool are the real ones."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from dsv4_operator.api import API_VERSION, KIND
from dsv4_operator.api.status import DSV4DeploymentStatus, Phase
from dsv4_operator.kube.cache import Cache
from dsv4_operator.reconcile import watches
from dsv4_operator.reconcile.controller import Controller
from dsv4_operator.reconcile.expectations import Expectations, Write
from dsv4_operator.render.meta import Owner, metadata

NS = "serving"
BOUND_S = 10.0


class RecordingPasses:
    """Stands in for `Reconciler`: each pass records itself and, while ``gate`` is closed,
    blocks (a pass in progress)."""

    def __init__(self, recheck: Callable[[int], float | None] = lambda n: None) -> None:
        self.expectations = Expectations()
        self.calls: list[tuple[str, str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.recheck = recheck
        self._lock = threading.Lock()
        self.running = 0
        self.peak = 0

        self.remembers: set[str] = set()  # uids a pass remembered (what `forget` drops)

    def remembered(self) -> dict[str, int]:
        return {"expectations": len(self.expectations), "renders": len(self.remembers)}

    def forget(self, namespace: str, name: str, uid: str, name_reused: bool = False) -> None:
        self.remembers.discard(uid)

    def reconcile_now(self, namespace: str, name: str) -> float | None:
        with self._lock:
            self.calls.append((namespace, name))
            self.running += 1
            self.peak = max(self.peak, self.running)
        try:
            self.gate.wait(BOUND_S)
            self.remembers.add(f"uid-{name}")  # as a real pass keeps its render, at its end
            return self.recheck(len(self.calls))
        finally:
            with self._lock:
                self.running -= 1


def deployment(name: str, annotation: str = "", status: dict | None = None) -> dict[str, Any]:
    obj = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "generation": 1,
            "resourceVersion": annotation or "1",
            "annotations": {"note": annotation},
        },
        "spec": {},
    }
    if status is not None:
        obj["status"] = status
    return obj


def statefulset(owner: str, ready: int) -> dict[str, Any]:
    meta = metadata(Owner(owner, NS, f"uid-{owner}"), f"{owner}-decode", "decode")
    meta["annotations"] = {"inference.dsv4.dev/applied-hash": "h"}
    meta["resourceVersion"] = str(ready)
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": meta,
        "spec": {"replicas": 1},
        "status": {"readyReplicas": ready},
    }


async def until(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + BOUND_S
    while not done():
        assert time.monotonic() < deadline, f"not {what} within {BOUND_S:.0f}s"
        await asyncio.sleep(0.01)


def world(
    passes: RecordingPasses, workers: int = 2, settle_s: float = 0.05
) -> tuple[Controller, Cache]:
    cache = Cache(watches.stores())
    for store in cache.stores.values():
        store.replace([])  # listed: the caches are synced
    controller = Controller(
        passes, cache, asyncio.get_running_loop(), workers=workers, resync_s=3600, settle_s=settle_s
    )
    return controller, cache


def idle(controller: Controller) -> bool:
    queue = controller.queue
    return not (len(queue) or queue._delayed or queue._processing or queue._dirty)


async def flash_pass_running(
    passes: RecordingPasses,
) -> tuple[Controller, asyncio.Task[None]]:
    """A controller running, and a pass of `flash` held in flight (the gate closed)."""
    controller, _ = world(passes)
    running = asyncio.create_task(controller.run())
    passes.gate.clear()
    controller.deployment_event(None, deployment("flash"))
    await until("the first pass running", lambda: passes.running == 1)
    return controller, running


def test_events_during_a_pass_collapse_into_one_follow_up_pass():
    async def main() -> int:
        passes = RecordingPasses()
        controller, running = await flash_pass_running(passes)
        # During the pass: 20 edits of the resource and 20 status updates of a child.
        for i in range(20):
            controller.deployment_event("MODIFIED", deployment("flash", annotation=str(i + 2)))
            await asyncio.to_thread(
                controller.changed,
                "StatefulSet",
                statefulset("flash", i),
                statefulset("flash", i + 1),
            )
        await until("the child events' settle windows over", lambda: not controller.queue._delayed)
        passes.gate.set()
        await until("the follow-up pass done", lambda: len(passes.calls) == 2 and idle(controller))
        running.cancel()
        return len(passes.calls)

    assert asyncio.run(main()) == 2


def test_events_while_queued_collapse_and_a_child_burst_is_one_pass():
    async def main() -> tuple[list[tuple[str, str]], dict[str, Any]]:
        passes = RecordingPasses()
        controller, _ = world(passes)
        for i in range(10):  # before any worker runs: one queued key
            controller.deployment_event("MODIFIED", deployment("flash", annotation=str(i)))
        running = asyncio.create_task(controller.run())
        await until("the pass", lambda: len(passes.calls) == 1 and idle(controller))
        for i in range(10):  # a burst of child status updates: one settle window
            controller.changed("StatefulSet", statefulset("flash", i), statefulset("flash", i + 1))
        await until("the burst's pass", lambda: len(passes.calls) == 2 and idle(controller))
        running.cancel()
        return passes.calls, controller.stats()

    calls, stats = asyncio.run(main())
    assert calls == [(NS, "flash")] * 2
    # /debug/passes tells what asked for the two passes, and whose they were.
    assert stats["wakes"] == {"DSV4Deployment": 10, "StatefulSet": 10}
    assert [whose for whose, _ in stats["started"]] == [f"{NS}/flash"] * 2


def test_a_pass_that_starts_in_a_settle_window_covers_it():
    """A child's change waits out its settle window; a spec edit meanwhile starts a pass at
    once, which reads that change too: nothing is left to run when the window would end."""

    async def main() -> tuple[list[tuple[str, str]], bool]:
        passes = RecordingPasses()
        controller, _ = world(passes, settle_s=BOUND_S)
        running = asyncio.create_task(controller.run())
        controller.deployment_event(None, deployment("flash"))
        await until("the first pass", lambda: len(passes.calls) == 1 and idle(controller))
        controller.changed("StatefulSet", statefulset("flash", 0), statefulset("flash", 1))
        await until("the window open", lambda: bool(controller.queue._delayed))
        controller.deployment_event("MODIFIED", deployment("flash", annotation="edited"))
        await until("the edit's pass", lambda: len(passes.calls) == 2)
        await until("the pass done", lambda: not controller.queue._processing)
        left = idle(controller)
        running.cancel()
        return passes.calls, left

    calls, idle_after = asyncio.run(main())
    assert calls == [(NS, "flash")] * 2
    assert idle_after  # the window's add went with the pass that covered it


def test_passes_are_bounded_and_one_deployment_never_runs_twice_at_once():
    async def main() -> tuple[int, list[tuple[str, str]]]:
        passes = RecordingPasses()
        controller, _ = world(passes, workers=2)
        passes.gate.clear()
        running = asyncio.create_task(controller.run())
        for name in ("a", "b", "c", "d", "e"):
            controller.deployment_event(None, deployment(name))
        await until("two passes running", lambda: passes.running == 2)
        controller.deployment_event("MODIFIED", deployment("a", annotation="x"))
        passes.gate.set()
        await until("every pass done", lambda: len(passes.calls) == 6 and idle(controller))
        running.cancel()
        return passes.peak, passes.calls

    peak, calls = asyncio.run(main())
    assert peak == 2
    assert sorted(calls) == sorted([(NS, n) for n in "abcde"] + [(NS, "a")])


def test_the_operators_own_status_write_wakes_nothing_but_someone_elses_does():
    async def main() -> tuple[int, int]:
        passes = RecordingPasses()
        controller, _ = world(passes)
        running = asyncio.create_task(controller.run())
        controller.deployment_event(None, deployment("flash"))
        await until("the first pass", lambda: len(passes.calls) == 1 and idle(controller))
        written = DSV4DeploymentStatus(phase=Phase.READY, observed_generation=1)
        raw = written.model_dump(mode="json", by_alias=True, exclude_none=True)
        passes.expectations.status_written((NS, "flash"), written)  # what the pass wrote
        controller.deployment_event("MODIFIED", deployment("flash", annotation="", status=raw))
        after_own = controller.queue.added
        edited = {**raw, "phase": "Degraded"}  # someone else rewrote it
        controller.deployment_event("MODIFIED", deployment("flash", status=edited))
        await until("the second pass", lambda: len(passes.calls) == 2 and idle(controller))
        running.cancel()
        return after_own, controller.queue.added

    assert asyncio.run(main()) == (1, 2)


def test_a_pass_waits_until_the_cache_shows_its_deployments_last_writes():
    async def main() -> tuple[int, int]:
        passes = RecordingPasses()
        controller, cache = world(passes)
        child = statefulset("flash", 0)
        passes.expectations.wrote((NS, "flash"), Write("StatefulSet", NS, "flash-decode", None))
        controller.deployment_event(None, deployment("flash"))
        running = asyncio.create_task(controller.run())
        await until("the pass held", lambda: controller.held >= 2)
        before = len(passes.calls)
        cache.store("StatefulSet").upsert(child)  # the watch delivers the created child
        await until("the pass", lambda: len(passes.calls) == 1)
        running.cancel()
        return before, len(passes.calls)

    assert asyncio.run(main()) == (0, 1)


def test_a_deadline_wakes_the_deployment_without_an_event():
    """A pass that waits for a deadline (the progress deadline, a placement timeout) gets a
    pass just after it, whether or not anything else happens."""

    async def main() -> list[tuple[str, str]]:
        passes = RecordingPasses(recheck=lambda n: 0.0 if n == 1 else None)
        controller, _ = world(passes)
        controller.deployment_event(None, deployment("flash"))
        running = asyncio.create_task(controller.run())
        await until("the deadline's pass", lambda: len(passes.calls) == 2)
        running.cancel()
        return passes.calls

    assert asyncio.run(main()) == [(NS, "flash")] * 2


def test_resyncs_of_deployments_created_together_are_spread_over_the_period():
    async def main() -> tuple[float, list[float]]:
        passes = RecordingPasses()
        controller, _ = world(passes, workers=4)
        running = asyncio.create_task(controller.run())
        names = [f"d{i}" for i in range(40)]
        for name in names:
            controller.deployment_event(None, deployment(name))
        await until("every first pass", lambda: len(passes.calls) == 40 and idle(controller))
        now = controller.loop.time()
        when = [controller.queue._timers[((NS, n), "resync")].when() for n in names]
        running.cancel()
        return now, when

    now, when = asyncio.run(main())
    period = 3600
    assert all(period / 2 - 1 <= w - now <= period * 1.5 for w in when)
    # Spread, not a burst (in lock-step all 40 would share one instant): no tenth of the
    # period holds more than a quarter of them.  Each lands on its UID's slot of the
    # clock's period (`spread.next_slot`), so the tenths are the clock's, not counted from
    # whenever the test looked: those would rotate with the clock and could empty a tenth.
    tenths = Counter(int((w % period) / period * 10) for w in when)
    assert max(tenths.values()) <= 10 and len(tenths) == 10


def test_a_deployment_deleted_during_its_pass_is_forgotten_once_the_pass_ends():
    """The pass in flight remembers its deployment as it ends, after the deletion's
    forgetting: the controller forgets it again then, so deleting frees what it held."""

    async def main() -> dict[str, Any]:
        passes = RecordingPasses()
        controller, running = await flash_pass_running(passes)
        controller.deployment_event("DELETED", deployment("flash"))
        passes.gate.set()
        await until("idle", lambda: idle(controller) and passes.running == 0)
        await asyncio.sleep(0.05)
        stats = controller.stats()
        running.cancel()
        return stats

    stats = asyncio.run(main())
    assert stats["cached"] == 0
    assert stats["remembered"]["renders"] == 0
