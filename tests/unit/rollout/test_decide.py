"""The rollout state machine: untested flags never reach the stable workloads."""

from __future__ import annotations

import datetime as dt

from dsv4_engine.features import EngineFeatures, HiCacheFeature, IndexDtype, Role
from dsv4_operator.api.rollout import (
    CanarySpec,
    FlagSet,
    RolloutPhase,
    RolloutSpec,
    RolloutStatus,
    RolloutVerdict,
)
from dsv4_operator.rollout.decide import (
    Decision,
    Effect,
    Manual,
    ManualAction,
    Observed,
    ProbeOutcome,
    decide,
    role_flags,
)

T0 = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
STABLE = FlagSet(features=EngineFeatures(), image="engine:1")
BF16_HICACHE = FlagSet(
    features=EngineFeatures(
        hicache=HiCacheFeature(enabled=True, ratio=2.0), index_dtype=IndexDtype.BF16
    ),
    image="engine:1",
)
CANARY = CanarySpec()
ROLLOUT = RolloutSpec(stable_probe_interval_seconds=0)
PASS = ProbeOutcome(RolloutVerdict.PASS, 0.0, 0.004, 600, "demo-rollout-1")
FAIL = ProbeOutcome(RolloutVerdict.FAIL, 0.15, 0.3, 26, "demo-rollout-1")


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def step(desired: FlagSet, status: RolloutStatus | None, **observed) -> Decision:
    observed.setdefault("now", T0)
    return decide(desired, status, Observed(**observed), CANARY, ROLLOUT)


def idle() -> RolloutStatus:
    return step(STABLE, None).status


def probing(desired: FlagSet = BF16_HICACHE) -> RolloutStatus:
    started = step(desired, idle()).status
    return step(desired, started, canary_ready=True).status


def test_first_sight_adopts_the_spec_without_a_canary():
    decision = step(STABLE, None)
    assert decision.status.phase is RolloutPhase.IDLE
    assert decision.status.stable == STABLE
    assert decision.effects == ()


def test_unchanged_flags_decide_nothing():
    status = idle()
    decision = step(STABLE, status, now=at(5))
    assert decision.status == status
    assert decision.effects == () and decision.events == ()


def test_flag_change_starts_a_canary_and_keeps_stable_flags():
    decision = step(BF16_HICACHE, idle())
    assert decision.status.phase is RolloutPhase.CANARY_STARTING
    assert decision.status.canary == BF16_HICACHE
    assert decision.effects == (Effect.APPLY_CANARY,)
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
    assert Effect.DELETE_CANARY in failed.effects
    assert failed.status.rejected_revision == BF16_HICACHE.revision
    assert role_flags(failed.status, Role.DECODE) == STABLE
    again = step(BF16_HICACHE, failed.status, now=at(3600))
    assert again.status.phase is RolloutPhase.ROLLED_BACK
    assert Effect.APPLY_CANARY not in again.effects
    assert "rejected" in again.status.message


def test_retry_annotation_tests_rejected_flags_again_once():
    failed = step(BF16_HICACHE, probing(), probe=FAIL).status
    retried = step(BF16_HICACHE, failed, manual=Manual(ManualAction.RETRY, "r1"))
    assert retried.status.phase is RolloutPhase.CANARY_STARTING
    failed_again = step(BF16_HICACHE, probing(), probe=FAIL).status.model_copy(
        update={"handled_retry": "r1"}
    )
    same_token = step(BF16_HICACHE, failed_again, manual=Manual(ManualAction.RETRY, "r1"))
    assert same_token.status.phase is RolloutPhase.ROLLED_BACK


def test_other_flags_after_a_reject_start_a_new_canary():
    failed = step(BF16_HICACHE, probing(), probe=FAIL).status
    fp8_hicache = BF16_HICACHE.model_copy(
        update={
            "features": BF16_HICACHE.features.model_copy(update={"index_dtype": IndexDtype.FP8})
        }
    )
    decision = step(fp8_hicache, failed)
    assert decision.status.phase is RolloutPhase.CANARY_STARTING
    assert decision.status.canary_revision == fp8_hicache.revision


def test_pass_promotes_decode_first_then_prefill_then_deletes_canary():
    passed = step(BF16_HICACHE, probing(), probe=PASS)
    assert passed.status.phase is RolloutPhase.PROMOTING
    assert passed.status.verdict is RolloutVerdict.PASS
    first = step(BF16_HICACHE, passed.status)
    assert first.status.promoted_roles == (Role.DECODE,)
    assert role_flags(first.status, Role.DECODE) == BF16_HICACHE
    assert role_flags(first.status, Role.PREFILL) == STABLE
    still_rolling = step(BF16_HICACHE, first.status, rolled=frozenset())
    assert still_rolling.status.promoted_roles == (Role.DECODE,)
    second = step(BF16_HICACHE, first.status, rolled=frozenset({Role.DECODE}))
    assert second.status.promoted_roles == (Role.DECODE, Role.PREFILL)
    done = step(BF16_HICACHE, second.status, rolled=frozenset(Role))
    assert done.status.phase is RolloutPhase.IDLE
    assert done.status.stable == BF16_HICACHE
    assert done.effects == (Effect.DELETE_CANARY,)
    assert done.status.verdict is RolloutVerdict.PASS  # the evidence stays visible


def test_canary_never_ready_is_inconclusive_and_rolled_back():
    started = step(BF16_HICACHE, idle()).status
    late = step(BF16_HICACHE, started, now=at(CANARY.ready_timeout_seconds + 1))
    assert late.status.phase is RolloutPhase.ROLLED_BACK
    assert late.status.verdict is RolloutVerdict.INCONCLUSIVE


def test_spec_change_during_probing_restarts_the_canary_with_new_flags():
    other = BF16_HICACHE.model_copy(update={"image": "engine:2"})
    decision = step(other, probing())
    assert decision.status.phase is RolloutPhase.CANARY_STARTING
    assert decision.status.canary == other
    assert decision.status.probe_attempt == 1  # attempts keep counting: old reports stay stale


def test_abort_and_manual_promote():
    aborted = step(BF16_HICACHE, probing(), manual=Manual(ManualAction.ABORT))
    assert aborted.status.phase is RolloutPhase.ROLLED_BACK
    assert aborted.status.verdict is RolloutVerdict.ABORTED
    promoted = step(BF16_HICACHE, probing(), manual=Manual(ManualAction.PROMOTE))
    assert promoted.status.phase is RolloutPhase.PROMOTING
    assert promoted.status.verdict is RolloutVerdict.MANUAL_PROMOTE


def test_a_probe_that_can_no_longer_decide_is_stopped_once():
    other = BF16_HICACHE.model_copy(update={"image": "engine:2"})
    late = at(CANARY.probe_timeout_seconds + 1)
    for decision in (
        step(BF16_HICACHE, probing(), manual=Manual(ManualAction.ABORT)),
        step(BF16_HICACHE, probing(), manual=Manual(ManualAction.PROMOTE)),
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


def test_stable_probe_runs_on_its_interval_and_flags_corruption():
    rollout = RolloutSpec(stable_probe_interval_seconds=600)
    status = decide(STABLE, None, Observed(now=T0), CANARY, rollout).status
    early = decide(STABLE, status, Observed(now=at(100)), CANARY, rollout)
    assert early.effects == ()
    due = decide(STABLE, status, Observed(now=at(601)), CANARY, rollout)
    assert due.effects == (Effect.START_STABLE_PROBE,)
    busy = decide(
        STABLE, due.status, Observed(now=at(1300), stable_probe_running=True), CANARY, rollout
    )
    assert busy.effects == (), "never two production probes at once"
    failed = decide(STABLE, due.status, Observed(now=at(700), stable_probe=FAIL), CANARY, rollout)
    assert failed.status.stable_probe_verdict is RolloutVerdict.FAIL
    assert failed.events[0][1] == "StableCorruption"
    assert failed.status.stable == STABLE  # no automatic change to production


def test_a_bad_canary_section_names_its_field():
    import pytest

    from dsv4_operator.rollout.controller import RolloutSpecError, _section

    with pytest.raises(RolloutSpecError, match=r"^spec\.canary\.requests: "):
        _section(CanarySpec, "canary", {"requests": 1})
    with pytest.raises(RolloutSpecError, match=r"^spec\.rollout\.order\.0: "):
        _section(RolloutSpec, "rollout", {"order": ["router"]})
