"""The rollout state machine: from what the spec asks, what status remembers and what was
observed, decide the next status and the effects the reconciler must carry out.

Pure: no clock, no API.  Every transition is recorded in the returned status *before* the
reconciler acts on its effects, and every effect is idempotent (apply the canary, delete
it, start the probe of attempt N), so a pass interrupted anywhere is safely redone.  The
stable workloads are rendered from `status.rollout` (see `role_flags`), never from the spec
directly: that is what keeps untested flags out of production.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from enum import StrEnum

from dsv4_engine.features import Role
from dsv4_operator.api.rollout import (
    CanarySpec,
    FlagSet,
    RolloutPhase,
    RolloutSpec,
    RolloutStatus,
    RolloutVerdict,
)
from dsv4_operator.api.times import parse_stamp, stamp


class Effect(StrEnum):
    APPLY_CANARY = "ApplyCanary"  # render the canary slice from status.canary and apply it
    DELETE_CANARY = "DeleteCanary"
    START_PROBE = "StartProbe"  # probe the canary for attempt status.probe_attempt
    # Stop the probe attempt the previous status was waiting for: it can no longer decide
    # anything (aborted, timed out, superseded or promoted by hand) and would only load a
    # canary that is going away.
    STOP_PROBE = "StopProbe"
    START_STABLE_PROBE = "StartStableProbe"  # low-rate probe of the promoted deployment


class ManualAction(StrEnum):
    PROMOTE = "promote"
    ABORT = "abort"
    RETRY = "retry"


@dataclass(frozen=True)
class Manual:
    """A person's request, from an annotation; ``token`` makes a retry act once."""

    action: ManualAction
    token: str = ""


@dataclass(frozen=True)
class ProbeOutcome:
    verdict: RolloutVerdict
    rate: float | None
    bound: float | None
    samples: int
    report: str | None
    message: str = ""


@dataclass(frozen=True)
class Observed:
    now: dt.datetime
    canary_ready: bool = False
    probe: ProbeOutcome | None = None  # the result of the current attempt, once it exists
    probe_running: bool = False
    stable_probe: ProbeOutcome | None = None
    stable_probe_running: bool = False
    rolled: frozenset[Role] = frozenset()  # roles whose pods run their target flags, all Ready
    manual: Manual | None = None


@dataclass(frozen=True)
class Decision:
    status: RolloutStatus
    effects: tuple[Effect, ...] = ()
    events: tuple[tuple[str, str, str], ...] = field(default=())  # (type, reason, message)


def role_flags(status: RolloutStatus, role: Role) -> FlagSet:
    """The flags the stable workloads of ``role`` must run now."""
    if status.phase is RolloutPhase.PROMOTING and role in status.promoted_roles:
        assert status.canary is not None
        return status.canary
    return status.stable


def decide(
    desired: FlagSet,
    status: RolloutStatus | None,
    observed: Observed,
    canary: CanarySpec,
    rollout: RolloutSpec,
) -> Decision:
    now = stamp(observed.now)
    if status is None:
        # First sight of the resource: nothing serves users yet, so there is nothing to guard.
        first = RolloutStatus(
            stable=desired, stable_revision=desired.revision, phase_since=now, stable_probe_at=now
        )
        return Decision(first, events=(("Normal", "FlagsInitialized", _flags(desired)),))
    step = _Step(status, observed, now)
    step.manual_retry(desired)
    phase = step.status.phase
    if phase in (RolloutPhase.IDLE, RolloutPhase.ROLLED_BACK):
        step.maybe_start(desired)
        if step.status.phase is RolloutPhase.IDLE:
            step.stable_probe(rollout)
    elif phase in (RolloutPhase.CANARY_STARTING, RolloutPhase.PROBING):
        step.canary_phase(desired, canary)
    elif phase is RolloutPhase.PROMOTING:
        step.promote(rollout)
    if (
        phase is RolloutPhase.PROBING
        and step.status.phase is not RolloutPhase.PROBING
        and observed.probe is None
    ):
        step.effects.append(Effect.STOP_PROBE)
    return Decision(step.status, tuple(step.effects), tuple(step.events))


class _Step:
    """One decision's working state: the status being rewritten, effects and events."""

    def __init__(self, status: RolloutStatus, observed: Observed, now: str) -> None:
        self.status = status
        self.observed = observed
        self.now = now
        self.effects: list[Effect] = []
        self.events: list[tuple[str, str, str]] = []

    def update(self, **changes: object) -> None:
        if "phase" in changes and changes["phase"] != self.status.phase:
            changes.setdefault("phase_since", self.now)
        self.status = self.status.model_copy(update=changes)

    def manual_retry(self, desired: FlagSet) -> None:
        manual = self.observed.manual
        if manual is None or manual.action is not ManualAction.RETRY:
            return
        if manual.token == self.status.handled_retry:
            return
        self.update(handled_retry=manual.token)
        if self.status.rejected_revision is not None:
            self.events.append(
                ("Normal", "RetryRequested", f"retrying rejected flags {desired.revision}")
            )
            self.update(rejected_revision=None)

    def maybe_start(self, desired: FlagSet) -> None:
        if desired.revision == self.status.stable_revision:
            return
        if desired.revision == self.status.rejected_revision:
            verdict = self.status.verdict.value if self.status.verdict else "a failed canary"
            message = (
                f"flags {desired.revision} were rejected ({verdict}); they are not retried "
                "until the spec changes or `dsv4ctl rollout retry` is run"
            )
            if self.status.message != message:
                self.update(message=message)
                self.events.append(("Warning", "RolloutBlocked", message))
            return
        self.start_canary(desired, "CanaryStarted")

    def start_canary(self, desired: FlagSet, reason: str) -> None:
        self.update(
            phase=RolloutPhase.CANARY_STARTING,
            canary=desired,
            canary_revision=desired.revision,
            started_at=self.now,
            promoted_roles=(),
            verdict=None,
            rate=None,
            bound=None,
            samples=None,
            report=None,
            rejected_revision=None,
            message=f"canary with flags {desired.revision} starting",
        )
        self.effects.append(Effect.APPLY_CANARY)
        self.events.append(
            ("Normal", reason, f"canary {desired.revision} started: {_flags(desired)}")
        )

    def canary_phase(self, desired: FlagSet, canary: CanarySpec) -> None:
        manual = self.observed.manual
        if desired.revision != self.status.canary_revision:
            # The spec moved under a running canary: test what is asked for now instead.
            self.start_canary(desired, "CanarySuperseded")
            return
        if manual is not None and manual.action is ManualAction.ABORT:
            self.roll_back(RolloutVerdict.ABORTED, "aborted by a person")
            return
        if manual is not None and manual.action is ManualAction.PROMOTE:
            self.update(verdict=RolloutVerdict.MANUAL_PROMOTE)
            self.start_promotion("promoted by a person without a canary verdict")
            return
        self.effects.append(Effect.APPLY_CANARY)
        if self.status.phase is RolloutPhase.CANARY_STARTING:
            self.wait_ready(canary)
        else:
            self.wait_verdict(canary)

    def wait_ready(self, canary: CanarySpec) -> None:
        if self.observed.canary_ready:
            self.update(
                phase=RolloutPhase.PROBING,
                probe_attempt=self.status.probe_attempt + 1,
                message="canary Ready; probing it for output corruption",
            )
            self.effects.append(Effect.START_PROBE)
            self.events.append(
                ("Normal", "ProbingStarted", f"probe attempt {self.status.probe_attempt}")
            )
        elif self.waited() > canary.ready_timeout_seconds:
            self.roll_back(
                RolloutVerdict.INCONCLUSIVE,
                f"canary not Ready within {canary.ready_timeout_seconds}s",
            )

    def wait_verdict(self, canary: CanarySpec) -> None:
        outcome = self.observed.probe
        if outcome is not None:
            self.update(
                verdict=outcome.verdict,
                rate=outcome.rate,
                bound=outcome.bound,
                samples=outcome.samples,
                report=outcome.report,
            )
            if outcome.verdict is RolloutVerdict.PASS:
                self.start_promotion(_evidence(outcome))
            else:
                self.roll_back(outcome.verdict, outcome.message or _evidence(outcome))
        elif self.waited() > canary.probe_timeout_seconds:
            self.roll_back(
                RolloutVerdict.INCONCLUSIVE, f"no verdict within {canary.probe_timeout_seconds}s"
            )
        elif not self.observed.probe_running:
            # The operator restarted mid-probe (or the probe died): run the same attempt again.
            self.effects.append(Effect.START_PROBE)

    def start_promotion(self, why: str) -> None:
        self.update(phase=RolloutPhase.PROMOTING, promoted_roles=(), message=f"promoting: {why}")
        self.events.append(("Normal", "CanaryPassed", why))

    def promote(self, rollout: RolloutSpec) -> None:
        manual = self.observed.manual
        if manual is not None and manual.action is ManualAction.ABORT:
            self.roll_back(RolloutVerdict.ABORTED, "aborted by a person during promotion")
            return
        order = [*rollout.order, *(r for r in Role if r not in rollout.order)]
        promoted = self.status.promoted_roles
        if not set(promoted) <= self.observed.rolled:
            return  # the roles already promoted are still rolling
        pending = [role for role in order if role not in promoted]
        if pending:
            role = pending[0]
            self.update(promoted_roles=(*promoted, role), message=f"rolling {role.value}")
            self.events.append(("Normal", "RolePromoting", f"{role.value} → new flags"))
            return
        canary = self.status.canary
        assert canary is not None
        self.update(
            phase=RolloutPhase.IDLE,
            stable=canary,
            stable_revision=canary.revision,
            promoted_roles=(),
            stable_probe_at=self.now,
            stable_probe_verdict=None,
            message=f"flags {canary.revision} promoted",
        )
        self.effects.append(Effect.DELETE_CANARY)
        self.events.append(("Normal", "Promoted", f"stable now runs {_flags(canary)}"))

    def roll_back(self, verdict: RolloutVerdict, why: str) -> None:
        self.update(
            phase=RolloutPhase.ROLLED_BACK,
            verdict=verdict,
            rejected_revision=self.status.canary_revision,
            promoted_roles=(),
            message=f"rolled back ({verdict.value}): {why}",
        )
        self.effects.append(Effect.DELETE_CANARY)
        self.events.append(("Warning", "RolledBack", f"{verdict.value}: {why}"))

    def stable_probe(self, rollout: RolloutSpec) -> None:
        outcome = self.observed.stable_probe
        if outcome is not None and outcome.verdict != self.status.stable_probe_verdict:
            self.update(stable_probe_verdict=outcome.verdict)
            if outcome.verdict is RolloutVerdict.FAIL:
                self.events.append(("Warning", "StableCorruption", _evidence(outcome)))
        interval = rollout.stable_probe_interval_seconds
        if self.observed.stable_probe_running:
            return  # one low-rate probe at a time; the interval counts from its start
        if interval and self.waited(self.status.stable_probe_at) >= interval:
            self.update(stable_probe_at=self.now)
            self.effects.append(Effect.START_STABLE_PROBE)

    def waited(self, since: str | None = None) -> float:
        start = since or self.status.phase_since
        if start is None:
            return 0.0
        return (self.observed.now - parse_stamp(start)).total_seconds()


def _evidence(outcome: ProbeOutcome) -> str:
    if outcome.rate is None:
        return f"{outcome.verdict.value} after {outcome.samples} samples"
    return (
        f"{outcome.verdict.value}: corruption rate {outcome.rate:.2%} "
        f"(upper bound {outcome.bound:.2%}) over {outcome.samples} samples"
    )


def _flags(flags: FlagSet) -> str:
    f = flags.features
    hicache = "on" if f.hicache.enabled else "off"
    return f"hicache={hicache} indexDtype={f.index_dtype.value} image={flags.image}"
