"""The verdict and rollback counters count what the rollout decided, whoever decided it.

`DSV4CanaryFailed` and the dashboard's verdict panel read `dsv4_operator_canary_verdicts_total`:
a person's promote or abort, or a canary that never became Ready, must show there as a
probe's FAIL does — once, on the pass that records it, and never again on later passes.
Run through the real reconciler against the in-memory API double (`harness`).
"""

from __future__ import annotations

import pytest

from dsv4_operator.api.rollout import RolloutVerdict
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
