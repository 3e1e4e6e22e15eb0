"""The verdict and rollback counters count what the rollout decided, whoever decided it.

`DSV4CanaryFailed` and the dashboard's verdict panel read `dsv4_operator_canary_verdicts_total`:
a person's promote or abort, or a canary that never became Ready, must show there as a
probe's FAIL does — once, on the pass that records it, and never again on later passes.
Run through the real reconciler against the in-memory API double (`harness`).
"""

from __future__ import annotations

import pytest

from dsv4_operator.api.rollout import RolloutVerdict, WatchVerdict
from dsv4_operator.metrics import REGISTRY
from dsv4_operator.rollout.decide import ManualAction
from tests.unit.operator.harness import FAIL, FP4, HICACHE, NS, World

pytestmark = pytest.mark.slow


def counted(name: str) -> dict[str, float]:
    """This deployment's verdict counts by verdict, and its rollbacks (``rollbacks``)."""
    labels = {"namespace": NS, "name": name}
    counts = {
        v.value: REGISTRY.get_sample_value(
            "dsv4_operator_canary_verdicts_total", {**labels, "verdict": v.value}
        )
        or 0.0
        for v in RolloutVerdict
    }
    counts["rollbacks"] = REGISTRY.get_sample_value("dsv4_operator_rollbacks_total", labels) or 0.0
    return counts


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


def started(world: World, patch: dict) -> str:
    """Asks for other flags and returns the canary's revision once it is starting."""
    world.patch_spec("flash", patch)
    world.until("canary starting", lambda: world.phase() == "CanaryStarting", passes=3)
    return world.rollout()["canaryRevision"]


def test_every_verdict_is_counted_once_whether_a_probe_or_a_person_reached_it():
    world = World()
    world.create("flash")
    world.until("Ready", lambda: (world.obj().get("status") or {}).get("phase") == "Ready")
    before = counted("flash")

    world.control(ManualAction.ABORT, started(world, FP4), "t-abort")
    world.until("aborted", lambda: world.rollout().get("verdict") == "ABORTED")
    for _ in range(3):  # later passes read the same verdict: nothing more is counted
        world.step("flash")
    assert delta(before, counted("flash")) == {"ABORTED": 1, "rollbacks": 1}

    # Back to fp8 with HiCache on (HiCache with the fp4 indexer is a known-bad combination).
    hicache_fp8 = {"features": {**HICACHE["features"], "indexDtype": "fp8"}}
    world.control(ManualAction.PROMOTE, started(world, hicache_fp8), "t-promote")
    world.until("promoted", lambda: world.phase() == "Idle" and world.rollout()["verdict"])
    assert world.rollout()["verdict"] == "MANUAL_PROMOTE"
    assert delta(before, counted("flash")) == {"ABORTED": 1, "MANUAL_PROMOTE": 1, "rollbacks": 1}

    world.verdict = lambda job: FAIL
    started(world, {"features": {"kvCanary": "off"}})
    world.until("failed", lambda: world.phase() == "RolledBack")
    for _ in range(3):
        world.step("flash")
    assert delta(before, counted("flash")) == {
        "ABORTED": 1,
        "MANUAL_PROMOTE": 1,
        "FAIL": 1,
        "rollbacks": 2,
    }


def watch_result(name: str) -> dict[str, float | None]:
    labels = {"namespace": NS, "name": name}
    return {
        v.value: REGISTRY.get_sample_value(
            "dsv4_operator_stable_watch_result", {**labels, "result": v.value}
        )
        for v in WatchVerdict
    }


def test_a_watch_run_that_judged_nothing_is_exported_apart_from_a_clean_one():
    """`DSV4WatchNoEvidence` reads this: a run whose router was unreachable exports no
    corruption (`dsv4_operator_stable_corruption_detected` 0) and must not read as clean."""
    world = World()
    world.create("watched")
    world.until(
        "Ready",
        lambda: (world.obj("watched").get("status") or {}).get("phase") == "Ready",
        "watched",
    )
    assert set(watch_result("watched").values()) == {None}, "no run yet: nothing exported"
    empty = {"verdict": "INCONCLUSIVE", "rate": None, "bound": None, "samples": 0, "message": ""}
    world.patch_spec("watched", {"rollout": {"stableProbeIntervalSeconds": 60}})
    clean = {**empty, "rate": 0.0, "bound": 0.058, "samples": 50}
    for found, reported, other in (
        (WatchVerdict.NO_EVIDENCE, empty, WatchVerdict.CLEAN),
        (WatchVerdict.CLEAN, clean, WatchVerdict.NO_EVIDENCE),
    ):
        world.verdict = lambda job, reported=reported: reported
        world.until(
            f"a {found} run",
            lambda found=found: watch_result("watched")[found] == 1.0,
            "watched",
            seconds=30,
        )
        assert watch_result("watched")[other] == 0.0
