"""The operator's reconcile, driven pass by pass against `MemoryApi`, with crashes on cue.

`World` is one cluster (the API double and its controllers) and one operator process at a
time: a crash throws the process away and starts a fresh one (no memory carried over, as a
restarted pod), which continues from whatever the API holds.  The operator reads through
its real cache (`kube.cache`), filled before each pass with what its watches would
have delivered by then (`fill_cache`: the same selectors and transforms); a test that wants
a lagging cache skips the filling.  Probes run as the real `JobProbeExecutor` makes them: a
Job per attempt, whose scripted verdict lands in the attempt's report as the probe's own
field manager files it, and whose pod exits with the filing, a step later, or never
(`probe_exit`).
"""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Callable
from typing import Any, Literal

import orjson

from dsv4_dev.cluster.nodes import default_pools, node_manifests
from dsv4_operator.api import API_VERSION, KIND
from dsv4_operator.api.allowed import Allowed
from dsv4_operator.api.rollout import RolloutStatus
from dsv4_operator.api.samples import load_sample, merge_patch
from dsv4_operator.kube.cache import Cache
from dsv4_operator.reconcile import watches
from dsv4_operator.reconcile.reconciler import Reconciler
from dsv4_operator.rollout import manual, undo
from dsv4_operator.rollout.controller import RolloutController
from dsv4_operator.rollout.decide import ManualAction
from dsv4_operator.rollout.job_executor import JobProbeExecutor
from tests.unit.operator.memory_api import Crashed, MemoryApi

NS = "serving"
T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
# A PASS as a probe files it: 598 clean samples, each of which read its prefix back from the
# host tier (as on the reference engine, whose probes push every prompt there first), and
# no kv-canary violation counted by the canary's engines.
PASS = {
    "verdict": "PASS",
    "rate": 0.0,
    "bound": 0.004997,
    "samples": 598,
    "exercised": 598,
    "kv_canary_violations": 0,
    "message": "",
}
FAIL = {"verdict": "FAIL", "rate": 0.15, "bound": 0.31, "samples": 26, "message": "4/26 corrupt"}
FP4 = {"features": {"indexDtype": "fp4"}}  # another transfer format: promoted in pairs
HICACHE = {"features": {"hicache": {"enabled": True, "ratio": 2.0}}}  # same format: surged
# The same change, promoted role by role in place as spec.rollout.promotion may ask.
HICACHE_IN_PLACE = {**HICACHE, "rollout": {"promotion": "InPlace"}}
# Where the samples' host path lies (crds/samples/): allowed, as an administrator would.
MODEL_HOST_PATHS = ("/data/models",)


def fill_cache(cache: Cache, api: MemoryApi) -> None:
    """The cache as the operator's watches would have it now (none lagging)."""
    cache.store(KIND).replace(api.select(KIND, None))
    for watch in watches.WATCHES:
        if watch.kind in api.unserved:  # its list would answer 404
            cache.store(watch.stored_as).unserved()
            continue
        found = api.select(watch.kind, None, watch.selector, watch.field_selector)
        if watch.metadata_only:
            found = [{k: o[k] for k in ("apiVersion", "kind", "metadata")} for o in found]
        cache.store(watch.stored_as).replace([watch.transform(o) for o in found])


def cache_dump(cache: Cache) -> bytes:
    return orjson.dumps(
        {kind: store.select(None, None, None) for kind, store in cache.stores.items()},
        option=orjson.OPT_SORT_KEYS,
    )


class World:
    def __init__(self) -> None:
        self.api = MemoryApi()
        for node in node_manifests(default_pools(gpu_nodes=2, cpu_nodes=0)):
            self.api.user_apply(node)
        self.now = T0
        self.crashes = 0
        self.verdict: Callable[[dict[str, Any]], dict[str, Any] | None] = lambda job: PASS
        self.held: Callable[[dict[str, Any]], bool] = lambda obj: False
        # Checked after every pass: an invariant no crash or interleaving may break.
        self.checks: list[Callable[[World], None]] = []
        self.lagging = False  # True: passes read the cache as it was (no filling)
        # When a probe Job's pod exits: "filing" (in the step it files its report), "later"
        # (the step after: a real pod files, then exits, and the report's watch event wakes
        # a pass in between) or "never" (it hangs after filing).
        self.probe_exit: Literal["filing", "later", "never"] = "filing"
        self.start()

    # -- the operator process -----------------------------------------------------------
    def start(self) -> None:
        """A fresh operator process: nothing but the API survives from the last one."""
        self.cache = Cache(watches.stores())
        fill_cache(self.cache, self.api)
        executor = JobProbeExecutor(self.api, self.cache, image="operator:test")
        rollout = RolloutController(
            self.api,
            self.cache,
            executor,
            serving=lambda ns, service, port: True,  # no Services here: once Ready, serving
        )
        self.reconciler = Reconciler(
            self.api,
            self.cache,
            rollout,
            clock=lambda: self.now,
            allowed=Allowed(model_host_paths=MODEL_HOST_PATHS),
        )

    def reconcile(self, name: str) -> float | None:
        """One pass of the operator over ``name``, on the cache its watches would show
        (unless lagging); nothing it read from the cache may have been changed by it."""
        if not self.lagging:
            fill_cache(self.cache, self.api)
        before = cache_dump(self.cache)
        try:
            return self.reconciler.reconcile_now(NS, name)
        finally:
            assert cache_dump(self.cache) == before, "a pass changed objects it read"

    def crash_before_write(self, n: int) -> None:
        self.api.crash_before_write(n)

    # -- what a user does ---------------------------------------------------------------
    def create(self, name: str, patch: dict[str, Any] | None = None) -> None:
        sample = load_sample()
        obj = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": name, "namespace": NS},
            "spec": merge_patch(sample["spec"], patch or {}),
        }
        self.api.user_apply(obj)

    def patch_spec(self, name: str, patch: dict[str, Any]) -> None:
        def change(obj: dict[str, Any]) -> None:
            obj["spec"] = merge_patch(obj["spec"], patch)

        self.api.user_patch(KIND, NS, name, change)

    def annotate(self, name: str, key: str, value: str | None) -> None:
        def change(obj: dict[str, Any]) -> None:
            annotations = obj["metadata"].setdefault("annotations", {})
            if value is None:
                annotations.pop(key, None)
            else:
                annotations[key] = value

        self.api.user_patch(KIND, NS, name, change)

    def control(self, action: ManualAction, revision: str, token: str, name: str = "flash") -> None:
        """A person's rollout control (what `dsv4ctl rollout` writes)."""
        self.annotate(name, manual.ANNOTATION, manual.encode(action, token, revision))

    def undo(self, revision: str, token: str, name: str = "flash") -> None:
        """What `dsv4ctl rollout undo --to-revision` writes, in its one write: the spec
        edited to ask for ``revision`` as it served, and the control naming it."""
        status = RolloutStatus.model_validate(self.rollout(name))
        entry = undo.served(status, revision)
        assert entry is not None, f"{revision} is not in the history"

        def change(obj: dict[str, Any]) -> None:
            obj["spec"] = merge_patch(obj["spec"], undo.spec_patch(entry)["spec"])
            annotations = obj["metadata"].setdefault("annotations", {})
            annotations[manual.ANNOTATION] = manual.encode(ManualAction.UNDO, token, revision)

        self.api.user_patch(KIND, NS, name, change)

    def wipe_status(self, name: str, part: str | None = "rollout") -> None:
        """Status lost (a restore without it) or hand-edited: ``part`` None wipes it all."""

        def change(obj: dict[str, Any]) -> None:
            if part is None:
                obj.pop("status", None)
            else:
                (obj.get("status") or {}).pop(part, None)

        self.api.user_patch(KIND, NS, name, change)

    # -- time passing -------------------------------------------------------------------
    def step(self, *names: str, seconds: float = 5) -> None:
        """One pass per deployment, then the cluster's controllers and probes move.  A probe
        Job runs through the step after the one that created it, so a pass (and a crash)
        can find it still active, as a real probe takes minutes."""
        waiting = self.api.names("Job")
        for name in names:
            try:
                self.reconcile(name)
            except Crashed:
                self.crashes += 1
                self.start()
        for check in self.checks:
            check(self)
        self.api.settle(self.held)
        if self.probe_exit == "later":
            self.api.exit_probe_jobs()  # those that filed in the step before
        self.api.run_probe_jobs(self.verdict, only=waiting, exit_now=self.probe_exit == "filing")
        self.now += dt.timedelta(seconds=seconds)

    def until(
        self, what: str, done: Callable[[], bool], *names: str, passes: int = 40, seconds: float = 5
    ) -> None:
        for _ in range(passes):
            if done():
                return
            self.step(*(names or ("flash",)), seconds=seconds)
        if done():
            return
        raise AssertionError(f"not {what} after {passes} passes: {self.rollout('flash')}")

    # -- what is there ------------------------------------------------------------------
    def obj(self, name: str = "flash") -> dict[str, Any]:
        found = self.api.get(KIND, NS, name)
        assert found is not None
        return found

    def rollout(self, name: str = "flash") -> dict[str, Any]:
        return copy.deepcopy((self.obj(name).get("status") or {}).get("rollout") or {})

    def phase(self, name: str = "flash") -> str | None:
        return self.rollout(name).get("phase")

    def children(self, instance: str) -> dict[tuple[str, str], dict[str, Any]]:
        return {
            (kind, key_name): obj
            for (kind, ns, key_name), obj in self.api.objects.items()
            if ns == NS
            and (obj["metadata"].get("labels") or {}).get("app.kubernetes.io/instance") == instance
            and kind != "Event"
        }

    def events(self, reason: str) -> list[dict[str, Any]]:
        return [
            obj
            for (kind, _, _), obj in self.api.objects.items()
            if kind == "Event" and obj["reason"] == reason
        ]
