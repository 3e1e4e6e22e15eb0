"""The rollout state machine: untested flags never reach the stable workloads."""

from __future__ import annotations

import datetime as dt

import pytest

from dsv4_engine.features import EngineFeatures, HiCacheFeature, IndexDtype, Role
from dsv4_engine.probe import ProbeSettings
from dsv4_engine.probe.stats import minimum_samples, upper_bound
from dsv4_operator.api.rollout import (
    CanarySpec,
    EngineRevision,
    PairStage,
    Promotion,
    RolloutPhase,
    RolloutSpec,
    RolloutStatus,
    RolloutVerdict,
    Slot,
    Transfer,
    WatchVerdict,
)
from dsv4_operator.rollout.decide import (
    Decision,
    Effect,
    Manual,
    ManualAction,
    Observed,
    ProbeOutcome,
    canary_wanted,
    decide,
    first_status,
)
from dsv4_operator.rollout.pairs import Pairs, plan_slots, role_flags
from tests.unit.revisions import revision

T0 = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
STABLE = revision(EngineFeatures())
BF16_HICACHE = revision(
    EngineFeatures(hicache=HiCacheFeature(enabled=True, ratio=2.0), index_dtype=IndexDtype.BF16)
)
HICACHE = revision(EngineFeatures(hicache=HiCacheFeature(enabled=True, ratio=2.0)))
CANARY = CanarySpec()
ROLLOUT = RolloutSpec(stable_probe_interval_seconds=0)
IN_PLACE = RolloutSpec(stable_probe_interval_seconds=0, promotion=Promotion.IN_PLACE)
PASS = ProbeOutcome(RolloutVerdict.PASS, 0.0, 0.004, 600, "demo-rollout-1")
FAIL = ProbeOutcome(RolloutVerdict.FAIL, 0.15, 0.3, 26, "demo-rollout-1")


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def step(
    desired: EngineRevision, status: RolloutStatus, rollout: RolloutSpec = ROLLOUT, **observed
) -> Decision:
    observed.setdefault("now", T0)
    return decide(desired, status, Observed(**observed), CANARY, rollout, Pairs(1, 1))


def idle() -> RolloutStatus:
    return first_status(STABLE, T0).status


def probing(desired: EngineRevision = BF16_HICACHE) -> RolloutStatus:
    started = step(desired, idle()).status
    return step(desired, started, canary_ready=True).status


def control(action: ManualAction, token: str = "t1", revision: str | None = None) -> Manual:
    return Manual(action, token, revision or BF16_HICACHE.revision)


def test_first_sight_adopts_the_spec_without_a_canary():
    decision = first_status(STABLE, T0)
    assert decision.status.phase is RolloutPhase.IDLE
    assert decision.status.stable == STABLE
    assert decision.effects == ()
    assert not canary_wanted(decision.status)


def test_unchanged_flags_decide_nothing():
    status = idle()
    decision = step(STABLE, status, now=at(5))
    assert decision.status == status
    assert decision.effects == () and decision.events == ()


def test_flag_change_starts_a_canary_and_keeps_stable_flags():
    decision = step(BF16_HICACHE, idle())
    assert decision.status.phase is RolloutPhase.CANARY_STARTING
    assert decision.status.canary == BF16_HICACHE
    assert canary_wanted(decision.status)
    for role in Role:
        assert role_flags(decision.status, role) == STABLE


def test_ready_canary_is_probed_once_per_attempt():
    started = step(BF16_HICACHE, idle()).status
    waiting = step(BF16_HICACHE, started, canary_ready=False)
    assert waiting.status.phase is RolloutPhase.CANARY_STARTING
    ready = step(BF16_HICACHE, started, canary_ready=True)
    assert ready.status.phase is RolloutPhase.PROBING
    assert ready.status.probe_attempt == 1
    assert Effect.START_PROBE in ready.effects
    running = step(BF16_HICACHE, ready.status, probe_running=True)
    assert Effect.START_PROBE not in running.effects
    assert running.status.probe_attempt == 1


def test_restart_mid_probe_reruns_the_same_attempt_not_a_new_canary():
    status = probing()
    resumed = step(BF16_HICACHE, status, probe_running=False)
    assert resumed.effects.count(Effect.START_PROBE) == 1
    assert resumed.status.probe_attempt == status.probe_attempt
    assert resumed.status.canary_revision == status.canary_revision


def test_fail_rolls_back_and_the_reject_is_sticky():
    failed = step(BF16_HICACHE, probing(), probe=FAIL)
    assert failed.status.phase is RolloutPhase.ROLLED_BACK
    assert failed.status.verdict is RolloutVerdict.FAIL
    assert failed.status.rate == 0.15 and failed.status.report == "demo-rollout-1"
    assert not canary_wanted(failed.status)
    assert failed.status.rejected_revision == BF16_HICACHE.revision
    assert role_flags(failed.status, Role.DECODE) == STABLE
    again = step(BF16_HICACHE, failed.status, now=at(3600))
    assert again.status.phase is RolloutPhase.ROLLED_BACK
    assert not canary_wanted(again.status)
    assert "rejected" in again.status.message


def test_retry_tests_the_rejected_flags_again_exactly_once():
    failed = step(BF16_HICACHE, probing(), probe=FAIL).status
    retried = step(BF16_HICACHE, failed, manual=control(ManualAction.RETRY, "r1"))
    assert retried.status.phase is RolloutPhase.CANARY_STARTING
    assert retried.status.handled_action == "r1"
    # The annotation stays (the operator never writes the resource): read again on every
    # later pass, it acts no more, not even after the retried flags fail again.
    failed_again = step(BF16_HICACHE, retried.status, canary_ready=True).status
    failed_again = step(BF16_HICACHE, failed_again, probe=FAIL).status
    same = step(BF16_HICACHE, failed_again, manual=control(ManualAction.RETRY, "r1"))
    assert same == step(BF16_HICACHE, failed_again), "a handled control is as none at all"
    assert same.status.phase is RolloutPhase.ROLLED_BACK


def test_other_flags_after_a_reject_start_a_new_canary():
    failed = step(BF16_HICACHE, probing(), probe=FAIL).status
    fp8_hicache = revision(BF16_HICACHE.features.model_copy(update={"index_dtype": IndexDtype.FP8}))
    decision = step(fp8_hicache, failed)
    assert decision.status.phase is RolloutPhase.CANARY_STARTING
    assert decision.status.canary_revision == fp8_hicache.revision


def test_in_place_asked_for_promotes_decode_first_then_prefill_and_frees_the_canary():
    """HiCache keeps the transfer format, and spec.rollout.promotion is InPlace: roles roll
    one after the other in the one slot."""
    at_start = step(HICACHE, idle(), IN_PLACE).status
    assert at_start.transfer is Transfer.COMPATIBLE
    passed = step(HICACHE, probing(HICACHE), IN_PLACE, probe=PASS)
    assert passed.status.phase is RolloutPhase.PROMOTING
    assert passed.status.promotion is Promotion.IN_PLACE and passed.status.pair_stage is None
    assert passed.status.verdict is RolloutVerdict.PASS
    assert not canary_wanted(passed.status), "the promotion gets the canary's GPUs back"
    first = step(HICACHE, passed.status, IN_PLACE)
    assert first.status.promoted_roles == (Role.DECODE,)
    assert role_flags(first.status, Role.DECODE) == HICACHE
    assert role_flags(first.status, Role.PREFILL) == STABLE
    still_rolling = step(HICACHE, first.status, IN_PLACE, rolled=frozenset())
    assert still_rolling.status.promoted_roles == (Role.DECODE,)
    second = step(HICACHE, first.status, IN_PLACE, rolled=frozenset({Role.DECODE}))
    assert second.status.promoted_roles == (Role.DECODE, Role.PREFILL)
    done = step(HICACHE, second.status, IN_PLACE, rolled=frozenset(Role))
    assert done.status.phase is RolloutPhase.IDLE
    assert done.status.stable == HICACHE and done.status.slot is Slot.BLUE
    assert done.status.verdict is RolloutVerdict.PASS  # the evidence stays visible


def test_a_promotion_past_its_deadline_rolls_back_the_promoted_roles():
    rollout = IN_PLACE.model_copy(update={"promotion_timeout_seconds": 600})
    passed = step(HICACHE, probing(HICACHE), rollout, probe=PASS).status
    first = step(HICACHE, passed, rollout, now=at(10)).status
    assert role_flags(first, Role.DECODE) == HICACHE
    in_time = step(HICACHE, first, rollout, now=at(590))
    assert in_time.status.phase is RolloutPhase.PROMOTING
    late = step(HICACHE, first, rollout, now=at(601))
    assert late.status.phase is RolloutPhase.ROLLED_BACK
    assert late.status.verdict is RolloutVerdict.PROMOTION_TIMEOUT
    assert "decode not rolled" in late.status.message
    assert late.status.rejected_revision == HICACHE.revision
    for role in Role:
        assert role_flags(late.status, role) == STABLE
    assert [e[1] for e in late.events] == ["RolledBack"]


def plans(status: RolloutStatus, pairs: Pairs) -> dict[Slot, tuple[str, tuple[int, int], bool]]:
    """Each slot: (the flags it runs, its replicas, whether its router serves)."""
    out = {}
    for plan in plan_slots(status, pairs):
        revisions = {plan.flags[role].revision for role in Role}
        assert len(revisions) == 1, "a slot runs one flag set during a paired promotion"
        out[plan.slot] = (revisions.pop(), plan.replicas, plan.router)
    return out


def walk_pairs(
    desired: EngineRevision, status: RolloutStatus, pairs: Pairs, rollout: RolloutSpec = ROLLOUT
) -> tuple[RolloutStatus, list]:
    """Drive a paired promotion to its end, every slot settling at once; each stage's
    (pair step, stage, layout), checking that the slots that serve always hold at least as
    many prefill and decode replicas as the spec asks for."""
    seen = []
    for _ in range(12):
        layout = plans(status, pairs)
        seen.append((status.pair_step, status.pair_stage, layout))
        serving = [v for v in layout.values() if v[2]]
        assert sum(v[1][0] for v in serving) >= pairs.prefill, layout
        assert sum(v[1][1] for v in serving) >= pairs.decode, layout
        if status.phase is RolloutPhase.IDLE:
            return status, seen
        everything = frozenset(Slot)
        status = decide(
            desired,
            status,
            Observed(now=T0, settled_slots=everything, routers_live=frozenset()),
            CANARY,
            rollout,
            pairs,
        ).status
    raise AssertionError(f"no end after 12 stages: {seen}")


def test_another_transfer_format_is_promoted_in_pairs_never_mixed():
    """fp8 → bf16 index-K: the new flags grow in the other slot, one prefill+decode pair
    at a time, each slot routing only its own engines; the old slot's router leaves before
    its last pair; capacity never drops below the spec's."""
    pairs = Pairs(prefill=1, decode=2)
    started = step(BF16_HICACHE, idle()).status
    assert started.transfer is Transfer.INCOMPATIBLE
    status = step(BF16_HICACHE, probing(), probe=PASS).status
    assert (status.pair_step, status.pair_stage) == (1, PairStage.GROW)
    old, new = STABLE.revision, BF16_HICACHE.revision
    status, seen = walk_pairs(BF16_HICACHE, status, pairs)
    assert [(k, stage) for k, stage, _ in seen] == [
        (1, PairStage.GROW),
        (1, PairStage.SHRINK),
        (2, PairStage.GROW),
        (2, PairStage.RETIRE),  # blue's last pair: its router leaves before its engines
        (2, PairStage.SHRINK),
        (0, None),
    ]
    assert seen[0][2] == {Slot.BLUE: (old, (1, 2), True), Slot.GREEN: (new, (1, 1), True)}
    assert seen[1][2][Slot.BLUE] == (old, (1, 1), True)  # keeps a pair: still serves
    assert seen[2][2][Slot.GREEN] == (new, (1, 2), True)
    assert seen[3][2][Slot.BLUE] == (old, (1, 1), False)
    assert seen[4][2][Slot.BLUE] == (old, (0, 0), False)
    assert seen[-1][2] == {Slot.GREEN: (new, (1, 2), True)}
    assert status.slot is Slot.GREEN and status.stable == BF16_HICACHE


def test_a_compatible_change_surges_by_default_never_below_the_spec_replicas():
    """HiCache keeps the transfer format, yet by default (spec.rollout.promotion Surge) it
    goes in pairs too: a role of one replica rolled in place would serve nothing while its
    new pod loads.  With the samples' 1 prefill + 1 decode, the new pair serves beside the
    old before the old one's router and engines go."""
    assert RolloutSpec().promotion is Promotion.SURGE
    status = step(HICACHE, probing(HICACHE), probe=PASS).status
    assert status.transfer is Transfer.COMPATIBLE
    assert status.promotion is Promotion.SURGE and status.pair_stage is PairStage.GROW
    assert "surge" in status.message
    status, seen = walk_pairs(HICACHE, status, Pairs(1, 1))
    old, new = STABLE.revision, HICACHE.revision
    assert [(k, stage, layout) for k, stage, layout in seen] == [
        (1, PairStage.GROW, {Slot.BLUE: (old, (1, 1), True), Slot.GREEN: (new, (1, 1), True)}),
        (1, PairStage.RETIRE, {Slot.BLUE: (old, (1, 1), False), Slot.GREEN: (new, (1, 1), True)}),
        (1, PairStage.SHRINK, {Slot.BLUE: (old, (0, 0), False), Slot.GREEN: (new, (1, 1), True)}),
        (0, None, {Slot.GREEN: (new, (1, 1), True)}),
    ]
    assert status.slot is Slot.GREEN and status.stable == HICACHE


def test_in_place_is_never_used_for_another_transfer_format():
    """InPlace would pair a prefill of one format with a decode of the other: a format
    change is promoted in pairs whatever spec.rollout.promotion says."""
    status = step(BF16_HICACHE, probing(), IN_PLACE, probe=PASS).status
    assert status.promotion is Promotion.SURGE and status.pair_stage is PairStage.GROW
    status, _ = walk_pairs(BF16_HICACHE, status, Pairs(2, 1), IN_PLACE)
    assert status.slot is Slot.GREEN and status.stable == BF16_HICACHE


def test_a_paired_promotion_rolled_back_empties_its_slot_router_first():
    pairs = Pairs(prefill=2, decode=2)
    status = step(BF16_HICACHE, probing(), probe=PASS).status
    aborted = decide(
        BF16_HICACHE,
        status,
        Observed(now=T0, manual=control(ManualAction.ABORT), routers_live=frozenset(Slot)),
        CANARY,
        ROLLOUT,
        pairs,
    ).status
    assert aborted.phase is RolloutPhase.ROLLED_BACK and aborted.retiring is Slot.GREEN
    layout = plans(aborted, pairs)
    assert layout[Slot.BLUE] == (STABLE.revision, (2, 2), True)
    assert layout[Slot.GREEN] == (BF16_HICACHE.revision, (1, 1), False)  # stops serving now
    # Its engines stay until its router has gone (in-flight requests finish), then go.
    still = decide(
        BF16_HICACHE,
        aborted,
        Observed(now=T0, routers_live=frozenset(Slot)),
        CANARY,
        ROLLOUT,
        pairs,
    ).status
    assert still.retiring is Slot.GREEN
    gone = decide(
        BF16_HICACHE,
        aborted,
        Observed(now=T0, routers_live=frozenset({Slot.BLUE})),
        CANARY,
        ROLLOUT,
        pairs,
    ).status
    assert gone.retiring is None and set(plans(gone, pairs)) == {Slot.BLUE}


def test_canary_never_ready_is_inconclusive_and_rolled_back():
    started = step(BF16_HICACHE, idle()).status
    late = step(BF16_HICACHE, started, now=at(CANARY.ready_timeout_seconds + 1))
    assert late.status.phase is RolloutPhase.ROLLED_BACK
    assert late.status.verdict is RolloutVerdict.INCONCLUSIVE


def test_a_canary_whose_names_are_held_by_another_owner_is_rolled_back():
    started = step(BF16_HICACHE, idle()).status
    blocked = step(BF16_HICACHE, started, canary_blocked="StatefulSet x is held by y")
    assert blocked.status.phase is RolloutPhase.ROLLED_BACK
    assert blocked.status.verdict is RolloutVerdict.INCONCLUSIVE
    assert "held by y" in blocked.status.message


def test_spec_change_during_probing_restarts_the_canary_with_new_flags():
    other = revision(BF16_HICACHE.features, image="engine:2")
    decision = step(other, probing())
    assert decision.status.phase is RolloutPhase.CANARY_STARTING
    assert decision.status.canary == other
    assert decision.status.probe_attempt == 1  # attempts keep counting: old reports stay stale


def test_abort_and_manual_promote_act_on_their_own_rollout():
    aborted = step(BF16_HICACHE, probing(), manual=control(ManualAction.ABORT))
    assert aborted.status.phase is RolloutPhase.ROLLED_BACK
    assert aborted.status.verdict is RolloutVerdict.ABORTED
    promoted = step(BF16_HICACHE, probing(), manual=control(ManualAction.PROMOTE))
    assert promoted.status.phase is RolloutPhase.PROMOTING
    assert promoted.status.verdict is RolloutVerdict.MANUAL_PROMOTE
    # The decision carries the verdict it reached (what the verdict counter counts) ...
    assert (aborted.verdict, promoted.verdict) == (
        RolloutVerdict.ABORTED,
        RolloutVerdict.MANUAL_PROMOTE,
    )
    # ... and a decision that reached none, even one reading a decided status, carries none.
    assert step(BF16_HICACHE, aborted.status).verdict is None
    assert step(BF16_HICACHE, probing()).verdict is None


def test_a_leftover_control_never_acts_on_a_later_rollout():
    """A promote written for one rollout, still there when the next starts, is refused."""
    old = revision(EngineFeatures(kv_canary="off"))
    leftover = control(ManualAction.PROMOTE, "t-old", revision=old.revision)
    started = step(BF16_HICACHE, idle(), manual=leftover)
    assert started.status.phase is RolloutPhase.CANARY_STARTING
    assert started.events[0][1] == "RolloutActionIgnored"
    assert f"no rollout of flags {old.revision}" in started.events[0][2]
    # Handled (refused) once: read again it stays refused and silent; never promotes.
    ready = step(BF16_HICACHE, started.status, canary_ready=True, manual=leftover)
    assert ready.status.phase is RolloutPhase.PROBING and ready.events[-1][1] != "CanaryPassed"
    idle_abort = step(STABLE, idle(), manual=control(ManualAction.ABORT, "t-2"))
    assert idle_abort.status.phase is RolloutPhase.IDLE
    assert idle_abort.events[0][1] == "RolloutActionIgnored"
    unbound = step(BF16_HICACHE, probing(), manual=Manual(ManualAction.PROMOTE, "t-3"))
    assert unbound.status.phase is RolloutPhase.PROBING
    assert "names no flags revision" in unbound.events[0][2]


def test_a_probe_that_can_no_longer_decide_is_stopped_once():
    other = revision(BF16_HICACHE.features, image="engine:2")
    late = at(CANARY.probe_timeout_seconds + 1)
    for decision in (
        step(BF16_HICACHE, probing(), manual=control(ManualAction.ABORT)),
        step(BF16_HICACHE, probing(), manual=control(ManualAction.PROMOTE)),
        step(BF16_HICACHE, probing(), probe_running=True, now=late),
        step(other, probing(), probe_running=True),
    ):
        assert decision.status.phase is not RolloutPhase.PROBING
        assert decision.effects.count(Effect.STOP_PROBE) == 1
        after = step(BF16_HICACHE, decision.status)
        assert Effect.STOP_PROBE not in after.effects
    # A probe that filed its verdict is over already; one still running is left alone.
    assert Effect.STOP_PROBE not in step(BF16_HICACHE, probing(), probe=FAIL).effects
    assert Effect.STOP_PROBE not in step(BF16_HICACHE, probing(), probe=PASS).effects
    assert Effect.STOP_PROBE not in step(BF16_HICACHE, probing(), probe_running=True).effects


WATCH = RolloutSpec(stable_probe_interval_seconds=600)
WATCH_CLEAN = ProbeOutcome(RolloutVerdict.INCONCLUSIVE, 0.0, 0.058, 50, "w", "too few")


def test_the_production_watch_runs_on_its_interval_and_flags_corruption():
    status = idle()
    early = step(STABLE, status, WATCH, now=at(100))
    assert early.effects == ()
    due = step(STABLE, status, WATCH, now=at(601))
    assert due.effects == (Effect.START_STABLE_PROBE,)
    busy = step(STABLE, due.status, WATCH, now=at(1300), stable_probe_running=True)
    assert busy.effects == (), "never two production probes at once"
    failed = step(STABLE, due.status, WATCH, now=at(700), stable_probe=FAIL)
    assert failed.status.stable_probe.verdict is WatchVerdict.CORRUPT
    assert failed.events[0][1] == "StableCorruption"
    assert failed.status.stable == STABLE  # no automatic change to production


def test_a_clean_watch_run_is_no_proof_and_says_so():
    due = step(STABLE, idle(), WATCH, now=at(601)).status
    clean = step(STABLE, due, WATCH, now=at(700), stable_probe=WATCH_CLEAN).status
    assert clean.stable_probe.verdict is WatchVerdict.CLEAN  # "NoCorruptionSeen", no PASS
    assert clean.stable_probe.samples == 50
    nothing = ProbeOutcome(RolloutVerdict.INCONCLUSIVE, None, None, 0, "w", "unreachable")
    blind = step(STABLE, due, WATCH, now=at(700), stable_probe=nothing).status
    assert blind.stable_probe.verdict is WatchVerdict.NO_EVIDENCE


def test_the_production_watch_keeps_running_after_a_rollback():
    failed = step(BF16_HICACHE, probing(), WATCH, probe=FAIL, now=at(10)).status
    assert failed.phase is RolloutPhase.ROLLED_BACK
    due = step(BF16_HICACHE, failed, WATCH, now=at(10 + 601))
    assert Effect.START_STABLE_PROBE in due.effects
    assert due.status.stable_probe.started_at


def test_a_canary_section_that_can_never_pass_names_the_field_and_the_minimum():
    with pytest.raises(ValueError, match=r"requests: 597 can never PASS .* the minimum is 598"):
        CanarySpec(requests=597)
    assert CanarySpec(requests=598).sample_count == 598
    assert CanarySpec().sample_count == 598  # unset: the minimum, which can PASS
    with pytest.raises(ValueError, match="the minimum is more than 100000"):
        CanarySpec(max_corruption_rate=1e-5, confidence=0.999)


@pytest.mark.parametrize(("rate", "confidence"), [(0.005, 0.95), (0.001, 0.99), (0.1, 0.9)])
def test_the_canary_and_dsv4ctl_probe_count_the_same_samples_by_default(rate, confidence):
    """One rule for "enough to PASS": the canary's default, `dsv4ctl probe`'s default and
    the smallest request count the CRD accepts are all `minimum_samples`."""
    least = minimum_samples(rate, confidence)
    canary = CanarySpec(max_corruption_rate=rate, confidence=confidence)
    probe = ProbeSettings(base_url="http://x", max_corruption_rate=rate, confidence=confidence)
    assert canary.sample_count == probe.sample_budget == least
    # And it is the fewest that can: zero corrupt out of `least` clears the exact bound.
    assert upper_bound(0, least, confidence) < rate <= upper_bound(0, least - 1, confidence)


def promote(desired: EngineRevision, status: RolloutStatus, seconds: float) -> RolloutStatus:
    """``desired`` canaried, passed and promoted (in pairs) from ``status``, at ``seconds``."""
    status = step(desired, status, now=at(seconds)).status
    status = step(desired, status, now=at(seconds), canary_ready=True).status
    status = step(desired, status, now=at(seconds), probe=PASS).status
    return walk_pairs(desired, status, Pairs(1, 1))[0]


def test_history_keeps_what_served_newest_first_within_its_limit():
    status = promote(HICACHE, idle(), 10)
    assert [h.revision for h in status.history] == [HICACHE.revision, STABLE.revision]
    serving, first = status.history
    assert serving.verdict is RolloutVerdict.PASS and serving.report == PASS.report
    assert serving.retired_at is None
    assert first.verdict is None and first.retired_at is not None, "adopted, then replaced"
    limited = RolloutSpec(stable_probe_interval_seconds=0, revision_history_limit=1)
    status = step(BF16_HICACHE, status, limited).status
    status = step(BF16_HICACHE, status, limited, canary_ready=True).status
    status = step(BF16_HICACHE, status, limited, probe=PASS).status
    status = walk_pairs(BF16_HICACHE, status, Pairs(1, 1), limited)[0]
    assert [h.revision for h in status.history] == [BF16_HICACHE.revision]


def undo(revision: str, token: str = "u1") -> Manual:
    return Manual(ManualAction.UNDO, token, revision)


def ignored(decision: Decision) -> str:
    """The one refusal of a control the decision reports (a Warning Event)."""
    (message,) = [m for t, r, m in decision.events if (t, r) == ("Warning", "RolloutActionIgnored")]
    return message


def test_undo_returns_to_the_flags_that_served_before_without_a_canary():
    """A→B promoted, then undo to A: promoted in pairs at once, verdict UNDO, with the build
    A ran; B is rejected (a person found it wanting) so a spec asking for it again starts
    nothing until a retry."""
    pinned = STABLE.model_copy(update={"image_digest": "ghcr.io/dsv4/engine@sha256:aa"})
    status = first_status(pinned, T0).status
    status = promote(HICACHE, status, 10)
    undone = step(STABLE, status, now=at(100), manual=undo(STABLE.revision))
    assert undone.status.phase is RolloutPhase.PROMOTING
    assert undone.status.verdict is RolloutVerdict.UNDO and undone.verdict is RolloutVerdict.UNDO
    assert undone.status.canary == pinned, "production returns to the build it ran"
    assert undone.status.pair_stage is PairStage.GROW and not canary_wanted(undone.status)
    assert undone.status.rejected_revision == HICACHE.revision
    assert Effect.START_PROBE not in undone.effects
    assert [e[1] for e in undone.events] == ["UndoRequested"]
    done, _ = walk_pairs(STABLE, undone.status, Pairs(1, 1))
    assert done.stable == pinned and done.phase is RolloutPhase.IDLE
    assert [(h.revision, h.verdict) for h in done.history] == [
        (STABLE.revision, RolloutVerdict.UNDO),
        (HICACHE.revision, RolloutVerdict.PASS),
    ]
    again = step(HICACHE, done, now=at(200))
    assert again.status.phase is RolloutPhase.IDLE and "rejected" in again.status.message


@pytest.mark.parametrize("case", ["serving", "never served", "in progress", "spec elsewhere"])
def test_undo_is_refused_where_it_would_not_return_to_proven_flags(case):
    status = promote(HICACHE, idle(), 10)
    revision, desired = STABLE.revision, STABLE
    if case == "serving":
        revision, desired = HICACHE.revision, HICACHE
    elif case == "never served":
        revision, desired = BF16_HICACHE.revision, BF16_HICACHE
    elif case == "in progress":
        status = step(BF16_HICACHE, status).status  # a canary of other flags starting
    else:
        desired = HICACHE  # the spec was not edited with the control
    refused = step(desired, status, manual=undo(revision))
    assert refused.status.verdict is not RolloutVerdict.UNDO
    assert refused.status.handled_action == "u1"
    message = ignored(refused)
    expected = {
        "serving": "already serve",
        "never served": "never served here",
        "in progress": "is in progress (abort it first)",
        "spec elsewhere": "dsv4ctl rollout undo` edits the spec",
    }[case]
    assert expected in message, message


def test_undo_never_returns_to_flags_rejected_or_found_corrupt_while_serving():
    status = promote(HICACHE, idle(), 10)
    rejected = step(STABLE, status, manual=undo(STABLE.revision), rejected={STABLE.revision: "x"})
    assert "were rejected (x)" in ignored(rejected)
    # A watch run found corruption while HiCache served; a later A→... undo to it is refused.
    watching = RolloutSpec(stable_probe_interval_seconds=60)
    running = step(HICACHE, status, watching, now=at(10_000)).status
    assert running.stable_probe is not None
    found = ProbeOutcome(RolloutVerdict.FAIL, 0.2, 0.4, 50, "flash-stable-1")
    watched = step(HICACHE, running, watching, now=at(10_010), stable_probe=found).status
    assert watched.history[0].watch_runs == 1 and watched.history[0].corruption
    moved = promote(BF16_HICACHE, watched, 20_000)
    refused = ignored(step(HICACHE, moved, manual=undo(HICACHE.revision)))
    assert "the production watch found corruption while flags" in refused, refused
