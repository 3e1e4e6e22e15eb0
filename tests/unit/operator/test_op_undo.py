"""`dsv4ctl rollout undo` through the real reconciler against the in-memory API double
(`harness`): production returns to flags that served before, with no canary, once, whatever
write the operator dies before; the flags left behind stay rejected."""

from __future__ import annotations

import pytest

from dsv4_operator.render.meta import Owner
from dsv4_operator.rollout import manual
from dsv4_operator.rollout.decide import ManualAction
from dsv4_operator.rollout.ledger import Ledger, ledger_name
from tests.unit.operator.harness import HICACHE, NS, World
from tests.unit.operator.test_op_verdict_metrics import counted, delta
from tests.unit.operator.test_reconcile_faults import created, promotions, ready_world

pytestmark = pytest.mark.slow


def promoted_world() -> tuple[World, str, str]:
    """A deployment that served A, then (HiCache on, PASS, surge) serves B: (world, A, B)."""
    world = ready_world()
    first = world.rollout()["stableRevision"]
    world.patch_spec("flash", HICACHE)
    world.until(
        "B promoted",
        lambda: world.phase() == "Idle" and world.rollout()["stableRevision"] != first,
    )
    world.until("canary gone", lambda: not world.children("flash--canary"))
    return world, first, world.rollout()["stableRevision"]


def undone(world: World, first: str) -> bool:
    rollout = world.rollout()
    return rollout["phase"] == "Idle" and rollout["stableRevision"] == first


def undo_writes() -> int:
    """How many writes a whole undo makes without faults (the crash points to try)."""
    world, first, _ = promoted_world()
    before = len(world.api.log)
    world.undo(first, "u1")
    world.until("undone", lambda: undone(world, first))
    return len(world.api.log) - before


def test_undo_returns_to_the_flags_before_with_no_canary_and_rejects_the_ones_left():
    world, first, second = promoted_world()
    before = counted("flash")
    jobs, canaries = created(world, "Job", "flash-"), created(world, "StatefulSet", "flash--")
    world.undo(first, "u1")
    world.until("undone", lambda: undone(world, first))
    rollout = world.rollout()
    assert rollout["verdict"] == "UNDO" and rollout["promotion"] == "Surge"
    assert rollout["rejectedRevision"] == second
    history = [
        (h["flags"]["spec"]["features"]["hicache"]["enabled"], h.get("verdict"))
        for h in rollout["history"]
    ]
    assert history == [(False, "UNDO"), (True, "PASS")], "A moved first, B behind it"
    assert created(world, "Job", "flash-") == jobs, "no probe ran"
    assert created(world, "StatefulSet", "flash--") == canaries, "no canary slice"
    assert delta(before, counted("flash")) == {"UNDO": 1}, "no rollback counted"
    owner = Owner("flash", NS, world.obj()["metadata"]["uid"])
    ledger = Ledger.of(world.api.get("ConfigMap", NS, ledger_name(owner)))
    assert ledger.rejected[second].verdict == "UNDO"
    (event,) = world.events("UndoRequested")
    assert (
        f"undo by a person (unnamed: the control says not who) to flags {first}" in event["message"]
    )
    # A spec that asks for the undone flags again (a GitOps sync of the old manifest) starts
    # nothing: the deployment says why and keeps serving what it returned to.
    world.patch_spec("flash", HICACHE)
    world.step("flash")
    world.step("flash")
    assert world.rollout()["stableRevision"] == first and not world.children("flash--canary")
    degraded = next(c for c in world.obj()["status"]["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "RolloutRejected", degraded


def test_undo_to_the_flags_it_left_is_refused_and_changes_nothing():
    world, first, second = promoted_world()
    world.undo(first, "u1")
    world.until("undone", lambda: undone(world, first))
    # Now B is rejected: an undo to it (its control written by hand) is refused.
    world.annotate("flash", manual.ANNOTATION, manual.encode(ManualAction.UNDO, "u2", second))
    world.step("flash")
    refusals = [e["message"] for e in world.events("RolloutActionIgnored")]
    assert any(f"flags {second} were rejected" in m for m in refusals), refusals
    assert world.rollout()["stableRevision"] == first


@pytest.mark.parametrize("crash_at", range(1, undo_writes() + 1))
def test_a_crash_before_any_write_of_an_undo_still_undoes_exactly_once(crash_at):
    world, first, second = promoted_world()
    start_promotions = promotions(world)
    world.undo(first, "u1")
    world.crash_before_write(crash_at)
    world.until("undone", lambda: undone(world, first), passes=60)
    assert world.crashes == 1
    rollout = world.rollout()
    assert rollout["verdict"] == "UNDO" and rollout["rejectedRevision"] == second
    assert promotions(world) == start_promotions + 1
    assert [h["verdict"] for h in rollout["history"]][:2] == ["UNDO", "PASS"]
