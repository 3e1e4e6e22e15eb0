"""The rollout state machine: from what the spec asks, what status remembers and what was
observed, decide the next status and the effects the reconciler must carry out.

Pure: no clock, no API.  Every transition is recorded in the returned status, which the
reconciler writes (with a resourceVersion precondition) *before* it acts on the effects or
re-renders the children, and every effect is idempotent (start the probe of attempt N, stop
it, start a watch run), so a pass interrupted anywhere is safely redone.  The
stable workloads are rendered from `status.rollout` (see `role_flags`), never from the spec
directly, and the canary slice exists exactly while `canary_wanted` says so: that is what
keeps untested flags out of production.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from dsv4_engine.features import Role
from dsv4_engine.probe.stats import percents
from dsv4_operator.api.rollout import (
    IN_PROGRESS,
    CanarySpec,
    EngineRevision,
    PairStage,
    PromotedRevision,
    Promotion,
    RolloutPhase,
    RolloutSpec,
    RolloutStatus,
    RolloutVerdict,
    Slot,
    StableProbeStatus,
    Transfer,
    WatchVerdict,
)
from dsv4_operator.api.rolls import differences
from dsv4_operator.api.times import parse_stamp, stamp
from dsv4_operator.rollout import undo
from dsv4_operator.rollout.digest import Builds
from dsv4_operator.rollout.pairs import Pairs, paired, serves
from dsv4_operator.spread import first_due


class Effect(StrEnum):
    START_PROBE = "StartProbe"  # probe the canary for attempt status.probe_attempt
    # Stop the probe attempt the previous status was waiting for: it can no longer decide
    # anything (aborted, timed out, superseded or promoted by hand) and would only load a
    # canary that is going away.
    STOP_PROBE = "StopProbe"
    START_STABLE_PROBE = "StartStableProbe"  # a production watch run


class ManualAction(StrEnum):
    PROMOTE = "promote"
    ABORT = "abort"
    RETRY = "retry"
    UNDO = "undo"


@dataclass(frozen=True)
class Manual:
    """A person's request, from the rollout-action annotation.

    ``token`` makes it act once; ``revision`` binds it to the flags it was meant for (the
    canary's for promote and abort, the rejected ones for retry, the earlier ones to return
    to for undo), so a control left over from an earlier rollout can never act on a later
    one."""

    action: ManualAction
    token: str
    revision: str | None = None
    error: str | None = None  # why the annotation could not be read (refused, with this)
    by: str | None = None  # who asked, as the admission fence checked it (None: unnamed)

    @property
    def who(self) -> str:
        return self.by or "a person (unnamed: the control says not who)"


@dataclass(frozen=True)
class ProbeOutcome:
    verdict: RolloutVerdict
    rate: float | None
    bound: float | None
    samples: int
    report: str | None
    message: str = ""
    threshold: float | None = None  # the budget the run was judged against (None: not said)
    # Samples that read a prefix back from the host tier (None: the report does not say, as
    # one filed before it was counted; `reports.distrust_pass` then counts none).
    exercised: int | None = None
    # kv-canary violations the engines counted during the run (None: not read, as by a
    # probe filed before it read them; `reports.distrust_pass` then trusts no PASS).
    kv_canary_violations: int | None = None

    @property
    def corrupt(self) -> int:
        return round((self.rate or 0.0) * self.samples)


@dataclass(frozen=True)
class Observed:
    now: dt.datetime
    canary_ready: bool = False
    probe: ProbeOutcome | None = None  # the result of the current attempt, once it exists
    probe_running: bool = False
    stable_probe: ProbeOutcome | None = None
    stable_probe_running: bool = False
    rolled: frozenset[Role] = frozenset()  # roles whose pods run their target flags, all Ready
    settled_slots: frozenset[Slot] = frozenset()  # slots at their planned replicas, all Ready
    routers_live: frozenset[Slot] = frozenset()  # slots whose router Deployment exists
    manual: Manual | None = None
    canary_blocked: str | None = None  # why the canary slice cannot be created (a name taken)
    canary_unplaced: str | None = None  # the scheduler's words for a canary pod it cannot place
    gpu_nodes: int = 0  # nodes with a GPU product label: one added may hold a waiting canary
    canary_builds: Builds = Builds()  # the builds the canary's engine pods ran (imageID)
    # Revisions rejected before, by anyone of this name (`rollout.ledger`): revision → why.
    rejected: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    status: RolloutStatus
    effects: tuple[Effect, ...] = ()
    events: tuple[tuple[str, str, str], ...] = field(default=())  # (type, reason, message)
    retried: str | None = None  # a rejected revision a person asked to try again
    # The verdict this decision reached, whatever reached it (a probe, a deadline, a
    # person): what the verdict metrics count, once, when the status recording it is written.
    verdict: RolloutVerdict | None = None


# Without a node added, a canary that found no capacity is tried again after this long,
# doubling with each attempt in a row (a pod gone elsewhere frees room the operator cannot
# see), up to the cap.
CAPACITY_RETRY_S = 300
CAPACITY_RETRY_MAX_S = 3600


def canary_wanted(status: RolloutStatus | None) -> bool:
    """The canary slice exists while its flags are being tested, and not a moment longer:
    a promotion gets the canary's GPUs back first, and a canary that found no capacity
    holds none while it waits for some."""
    if status is None or status.canary is None:
        return False
    if status.phase is RolloutPhase.CANARY_PENDING:
        return status.verdict is not RolloutVerdict.NO_CAPACITY
    return status.phase in (RolloutPhase.CANARY_STARTING, RolloutPhase.PROBING)


def first_status(
    desired: EngineRevision, now: dt.datetime, retry: Manual | None = None
) -> Decision:
    """First sight of a resource with no children: nothing serves users yet, so there is
    nothing to guard and the spec's revision is the stable one — unless it was rejected
    under this name before, which only ``retry``, a person's control naming it, overrides
    (the reconciler refuses it otherwise)."""
    at = stamp(now)
    status = RolloutStatus(
        stable=desired,
        stable_revision=desired.revision,
        phase_since=at,
        history=(PromotedRevision(flags=desired, promoted_at=at),),
    )
    events = [("Normal", "FlagsInitialized", flags_text(desired))]
    if retry is None:
        return Decision(status, events=tuple(events))
    status = status.model_copy(update={"handled_action": retry.token})
    events.append(("Normal", "RetryRequested", f"retrying rejected flags {retry.revision}"))
    return Decision(status, events=tuple(events), retried=retry.revision)


def decide(
    desired: EngineRevision,
    status: RolloutStatus,
    observed: Observed,
    canary: CanarySpec,
    rollout: RolloutSpec,
    pairs: Pairs,
    offset: float = 0.5,
) -> Decision:
    """``offset``: the deployment's fraction of the watch interval (`spread.phase` of its
    UID): where its first production watch run falls, so that deployments created together
    never probe together."""
    step = _Step(status, observed, stamp(observed.now), pairs, rollout, offset)
    step.release_retired_slot()
    step.manual_control(desired)
    phase = step.status.phase  # after a control acted (an abort ends the canary phases)
    if phase in (RolloutPhase.IDLE, RolloutPhase.ROLLED_BACK):
        step.maybe_start(desired)
    elif phase in (RolloutPhase.CANARY_STARTING, RolloutPhase.CANARY_PENDING, RolloutPhase.PROBING):
        step.canary_phase(desired, canary)
    elif phase is RolloutPhase.PROMOTING:
        step.promote()
    if step.status.phase in (RolloutPhase.IDLE, RolloutPhase.ROLLED_BACK):
        step.watch_production()  # the stable flags serve users: keep watching them
    if (
        status.phase is RolloutPhase.PROBING
        and step.status.phase is not RolloutPhase.PROBING
        and observed.probe is None
    ):
        step.effects.append(Effect.STOP_PROBE)
    return Decision(
        step.status, tuple(step.effects), tuple(step.events), step.retried, step.decided
    )


class _Step:
    """One decision's working state: the status being rewritten, effects and events."""

    def __init__(
        self,
        status: RolloutStatus,
        observed: Observed,
        now: str,
        pairs: Pairs,
        rollout: RolloutSpec,
        offset: float,
    ) -> None:
        self.status = status
        self.observed = observed
        self.now = now
        self.pairs = pairs
        self.rollout = rollout
        self.offset = offset
        self.effects: list[Effect] = []
        self.events: list[tuple[str, str, str]] = []
        self.retried: str | None = None
        # The last verdict set: a PASS refused at pinning ends INCONCLUSIVE, and a canary
        # started after an abort in the same decision does not erase the abort.
        self.decided: RolloutVerdict | None = None

    def update(self, **changes: object) -> None:
        if "phase" in changes and changes["phase"] != self.status.phase:
            changes.setdefault("phase_since", self.now)
        verdict = changes.get("verdict")
        if isinstance(verdict, RolloutVerdict):
            self.decided = verdict
        self.status = self.status.model_copy(update=changes)

    # -- manual controls ----------------------------------------------------------------
    def manual_control(self, desired: EngineRevision) -> None:
        """Act on a control once: its token, acted on or refused, goes into handledAction,
        and a control with that token is never looked at again (the annotation stays; the
        operator does not write the resource).  A control for other flags than the rollout
        in progress is refused."""
        manual = self.observed.manual
        if manual is None or manual.token == self.status.handled_action:
            return
        self.update(handled_action=manual.token)
        refused = self._refusal(manual, desired)
        if refused is not None:
            self.events.append(("Warning", "RolloutActionIgnored", f"{manual.action}: {refused}"))
            return
        if manual.action is ManualAction.RETRY:
            self.events.append(
                (
                    "Normal",
                    "RetryRequested",
                    f"retrying rejected flags {manual.revision}, asked by {manual.who}",
                )
            )
            self.update(rejected_revision=None)
            self.retried = manual.revision
        elif manual.action is ManualAction.UNDO:
            self.return_to(undo.served(self.status, manual.revision), manual.who)
        elif manual.action is ManualAction.ABORT:
            during = " during promotion" if self.status.phase is RolloutPhase.PROMOTING else ""
            self.roll_back(RolloutVerdict.ABORTED, f"aborted by {manual.who}{during}")
        else:
            self.update(verdict=RolloutVerdict.MANUAL_PROMOTE)
            why = f"promoted by {manual.who} without a canary verdict"
            self.events.append(("Normal", "CanaryPassed", why))
            self.start_promotion(why)

    def _refusal(self, manual: Manual, desired: EngineRevision) -> str | None:
        status = self.status
        if manual.error is not None:
            return manual.error
        if manual.revision is None:
            return "the annotation names no flags revision (use dsv4ctl rollout)"
        if manual.action is ManualAction.UNDO:
            return self._undo_refusal(manual.revision, desired)
        if manual.action is ManualAction.RETRY:
            if status.phase in IN_PROGRESS:
                return "a rollout is in progress"
            rejected = {*self.observed.rejected, status.rejected_revision} - {None}
            if not rejected:
                return "no rejected flags to retry"
            if manual.revision not in rejected:
                return f"flags {manual.revision} are not rejected ({', '.join(sorted(rejected))})"
            if desired.revision != manual.revision:
                return "the spec no longer asks for the rejected flags"
            return None
        if manual.revision != status.canary_revision or status.phase not in IN_PROGRESS:
            return f"no rollout of flags {manual.revision} is in progress"
        if manual.action is ManualAction.PROMOTE and status.phase is RolloutPhase.PROMOTING:
            return "already promoting"
        return None

    def _undo_refusal(self, revision: str, desired: EngineRevision) -> str | None:
        refused = undo.refusal(self.status, revision, self.observed.rejected)
        if refused is None and desired.revision != revision:
            return (
                f"the spec asks for flags {desired.revision}, not {revision} (`dsv4ctl rollout "
                "undo` edits the spec and asks in one write)"
            )
        return refused

    def return_to(self, entry: PromotedRevision | None, who: str) -> None:
        """Return to ``entry``'s flags, with the build they ran, through the same promotion
        as a PASS; the flags left behind are rejected (a person found them wanting), so a
        spec that asks for them again starts nothing until `dsv4ctl rollout retry`."""
        assert entry is not None  # `_undo_refusal` let it through
        stable, flags = self.status.stable, entry.flags
        same = (
            stable.transfer_key == flags.transfer_key and stable.image_digest == flags.image_digest
        )
        why = (
            f"undo by {who} to flags {entry.revision} (served from {entry.promoted_at}, "
            f"{entry.watch_runs} clean watch runs): no canary, proven when they served"
        )
        self.update(
            canary=flags,
            canary_revision=entry.revision,
            transfer=Transfer.COMPATIBLE if same else Transfer.INCOMPATIBLE,
            started_at=self.now,
            verdict=RolloutVerdict.UNDO,
            rate=None,
            bound=None,
            samples=None,
            report=None,
            rejected_revision=stable.revision,
        )
        self.events.append(("Normal", "UndoRequested", why))
        self.start_promotion(why)

    # -- the canary ---------------------------------------------------------------------
    def maybe_start(self, desired: EngineRevision) -> None:
        if desired.revision == self.status.stable_revision:
            return
        retried = desired.revision == self.retried
        earlier = None if retried else self.observed.rejected.get(desired.revision)
        if desired.revision == self.status.rejected_revision or earlier is not None:
            if desired.revision == self.status.rejected_revision:
                why = self.status.verdict.value if self.status.verdict else "a failed canary"
            else:
                why = f"earlier: {earlier}"
            message = (
                f"flags {desired.revision} were rejected ({why}); they are not retried "
                "until the spec changes or `dsv4ctl rollout retry` is run"
            )
            if self.status.message != message:
                self.update(message=message)
                self.events.append(("Warning", "RolloutBlocked", message))
            return
        self.start_canary(desired, "CanaryStarted")

    def start_canary(self, desired: EngineRevision, reason: str) -> None:
        same_format = desired.transfer_key == self.status.stable.transfer_key
        self.update(
            phase=RolloutPhase.CANARY_STARTING,
            canary=desired,
            canary_revision=desired.revision,
            transfer=Transfer.COMPATIBLE if same_format else Transfer.INCOMPATIBLE,
            started_at=self.now,
            promoted_roles=(),
            verdict=None,
            rate=None,
            bound=None,
            samples=None,
            report=None,
            verdict_reason=None,
            rejected_revision=None,
            capacity_nodes=None,
            capacity_attempts=0,
            retry_at=None,
            message=f"canary with flags {desired.revision} starting",
        )
        self.events.append(
            (
                "Normal",
                reason,
                f"canary {desired.revision} started: {changes_text(self.status.stable, desired)}",
            )
        )

    def canary_phase(self, desired: EngineRevision, canary: CanarySpec) -> None:
        if desired.revision != self.status.canary_revision:
            # The spec moved under a running canary: test what is asked for now instead.
            self.start_canary(desired, "CanarySuperseded")
            return
        if self.observed.canary_blocked is not None:
            self.roll_back(RolloutVerdict.INCONCLUSIVE, self.observed.canary_blocked)
            return
        unplaced = self.observed.canary_unplaced
        if self.status.phase is RolloutPhase.CANARY_PENDING:
            self.wait_capacity(desired, canary)
        elif self.status.phase is RolloutPhase.CANARY_STARTING and unplaced is not None:
            self.update(
                phase=RolloutPhase.CANARY_PENDING,
                message=f"{unplaced}; waiting up to {canary.placement_timeout_seconds}s for "
                "capacity",
            )
        elif self.status.phase is RolloutPhase.CANARY_STARTING:
            self.wait_ready(canary)
        else:
            self.wait_verdict(canary)

    def wait_capacity(self, desired: EngineRevision, canary: CanarySpec) -> None:
        """Capacity is not a verdict: a canary the scheduler cannot place waits for room up
        to the placement timeout, then gives its slice back (NoCapacity) without rejecting
        its flags, and is tried again when a GPU node is added or its backoff is over."""
        status, observed = self.status, self.observed
        if status.verdict is RolloutVerdict.NO_CAPACITY:
            grew = observed.gpu_nodes > (status.capacity_nodes or 0)
            due = status.retry_at is not None and observed.now >= parse_stamp(status.retry_at)
            if grew or due:
                attempts = status.capacity_attempts
                self.start_canary(desired, "CanaryRetried")
                self.update(capacity_attempts=attempts)
            return
        if observed.canary_unplaced is None:
            self.update(phase=RolloutPhase.CANARY_STARTING, message="canary placed; starting")
            return
        if self.waited() < canary.placement_timeout_seconds:
            return
        attempts = status.capacity_attempts + 1
        wait = min(CAPACITY_RETRY_S * 2 ** (attempts - 1), CAPACITY_RETRY_MAX_S)
        retry_at = stamp(observed.now + dt.timedelta(seconds=wait))
        why = observed.canary_unplaced
        self.update(
            verdict=RolloutVerdict.NO_CAPACITY,
            verdict_reason=why,
            capacity_nodes=observed.gpu_nodes,
            capacity_attempts=attempts,
            retry_at=retry_at,
            message=f"no capacity for the canary ({why}); flags {desired.revision} are not "
            f"rejected: tried again when a GPU node is added, or at {retry_at}",
        )
        self.events.append(("Warning", "CanaryNoCapacity", self.status.message))

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
                refusal = self.pin_build()
                if refusal is not None:
                    self.roll_back(RolloutVerdict.INCONCLUSIVE, refusal)
                    return
                self.events.append(("Normal", "CanaryPassed", evidence_text(outcome)))
                self.start_promotion(evidence_text(outcome))
            else:
                self.roll_back(outcome.verdict, outcome.message or evidence_text(outcome))
        elif self.waited() > canary.probe_timeout_seconds:
            self.roll_back(
                RolloutVerdict.INCONCLUSIVE, f"no verdict within {canary.probe_timeout_seconds}s"
            )
        elif not self.observed.probe_running:
            # The operator restarted mid-probe (or the probe died): run the same attempt again.
            self.effects.append(Effect.START_PROBE)

    def pin_build(self) -> str | None:
        """Bind the PASS to the build the canary ran: production is pinned to its digest.
        Returns why the PASS proves no one build (pods ran several), else None."""
        canary, builds = self.status.canary, self.observed.canary_builds
        assert canary is not None
        if len(builds.digests) > 1:
            return (
                f"the canary's engine pods ran {len(builds.digests)} builds of {canary.image} "
                f"({', '.join(sorted(builds.digests))}): the PASS proves none of them alone"
            )
        if not builds.digests or builds.unpinned:
            pods = ", ".join(builds.unpinned) or "none"
            self.events.append(
                ("Warning", "ImageNotPinned", f"{canary.image}: no registry digest reported "
                 f"(pods without one: {pods}); production runs the image by its name")
            )  # fmt: skip
            return None
        digest = next(iter(builds.digests))
        changes: dict[str, object] = {"canary": canary.model_copy(update={"image_digest": digest})}
        stable = self.status.stable.image_digest
        if stable is not None and stable != digest and self.status.transfer is Transfer.COMPATIBLE:
            changes["transfer"] = Transfer.INCOMPATIBLE  # one tag, another build: never mixed
        self.update(**changes)
        self.events.append(("Normal", "ImagePinned", f"{canary.image} ran as {digest}"))
        return None

    # -- promotion ----------------------------------------------------------------------
    def start_promotion(self, why: str) -> None:
        if self.status.transfer is Transfer.INCOMPATIBLE:
            # Another transfer format: never one role at a time (a prefill of one format
            # would feed a decode of the other), whatever spec.rollout.promotion says.
            self.promote_in_pairs(why, "another transfer format")
        elif self.rollout.promotion is Promotion.SURGE:
            # Never fewer Ready serving replicas than before: a role of one replica rolled
            # in place would serve nothing while its new pod starts.
            self.promote_in_pairs(why, "surge")
        else:
            self.update(
                phase=RolloutPhase.PROMOTING,
                promotion=Promotion.IN_PLACE,
                promoted_roles=(),
                pair_stage=None,
                verdict_reason=why,
                message=f"promoting role by role in place: {why}",
            )

    def promote_in_pairs(self, why: str, because: str) -> None:
        """Pairs grow in the other slot before old ones go (`rollout.pairs`)."""
        self.update(
            phase=RolloutPhase.PROMOTING,
            promotion=Promotion.SURGE,
            promoted_roles=(),
            pair_step=1,
            pair_stage=PairStage.GROW,
            retiring=None,
            verdict_reason=why,
            message=f"promoting in prefill+decode pairs ({because}): {why}",
        )

    def promote(self) -> None:
        rollout = self.rollout
        order = [*rollout.order, *(r for r in Role if r not in rollout.order)]
        promoted = self.status.promoted_roles
        rolling = [role.value for role in promoted if role not in self.observed.rolled]
        if self.waited() > rollout.promotion_timeout_seconds:
            if paired(self.status):
                pending = [f"pair {self.status.pair_step}/{self.pairs.steps}"]
            else:
                pending = rolling or [r.value for r in order if r not in promoted]
            self.roll_back(
                RolloutVerdict.PROMOTION_TIMEOUT,
                f"promotion did not finish within {rollout.promotion_timeout_seconds}s "
                f"({', '.join(pending)} not rolled); the promoted roles return to the stable "
                "flags",
            )
            return
        if paired(self.status):
            self.step_pairs()
            return
        if rolling:
            return  # the roles already promoted are still rolling
        pending = [role for role in order if role not in promoted]
        if pending:
            role = pending[0]
            self.update(promoted_roles=(*promoted, role), message=f"rolling {role.value}")
            self.events.append(("Normal", "RolePromoting", f"{role.value} → new flags"))
            return
        self.promoted(self.status.slot)

    def step_pairs(self) -> None:
        """One stage of a paired promotion (module `pairs`): each waits for the slots to
        settle at what the previous one asked for."""
        status, pairs, observed = self.status, self.pairs, self.observed
        k, new, old = status.pair_step, status.slot.other, status.slot
        if status.pair_stage is PairStage.GROW:
            if new not in observed.settled_slots:
                return
            retire = serves(pairs.left(k - 1)) and not serves(pairs.left(k))
            stage = PairStage.RETIRE if retire else PairStage.SHRINK
            self.update(pair_stage=stage, message=f"pair {k}/{pairs.steps} serves in {new}")
        elif status.pair_stage is PairStage.RETIRE:
            if old in observed.routers_live:
                return
            self.update(pair_stage=PairStage.SHRINK, message=f"{old} router retired")
        elif old in observed.settled_slots:
            if k >= pairs.steps:
                self.promoted(new)
                return
            self.update(pair_step=k + 1, pair_stage=PairStage.GROW, message=f"pair {k + 1}")
            self.events.append(
                ("Normal", "PairPromoted", f"pair {k}/{pairs.steps} moved to slot {new}")
            )

    def promoted(self, slot: Slot) -> None:
        canary = self.status.canary
        assert canary is not None
        self.update(history=self.promoted_history(canary))
        self.update(
            phase=RolloutPhase.IDLE,
            stable=canary,
            stable_revision=canary.revision,
            slot=slot,
            promoted_roles=(),
            pair_step=0,
            pair_stage=None,
            stable_probe=None,  # a watch of the old flags says nothing about the new ones
            message=f"flags {canary.revision} promoted",
        )
        self.events.append(("Normal", "Promoted", f"stable now runs {flags_text(canary)}"))

    def promoted_history(self, flags: EngineRevision) -> tuple[PromotedRevision, ...]:
        """The history with ``flags`` serving from now: first, its earlier entry (an undo's)
        folded in, what served until now retired; the oldest beyond the limit dropped."""
        earlier = undo.served(self.status, flags.revision)
        entry = PromotedRevision(
            flags=flags,
            promoted_at=self.now,
            verdict=self.status.verdict,
            report=self.status.report or (earlier.report if earlier else None),
            watch_runs=earlier.watch_runs if earlier else 0,
        )
        kept = [
            h.model_copy(update={"retired_at": h.retired_at or self.now})
            for h in self.status.history
            if h.revision != flags.revision
        ]
        return (entry, *kept)[: self.rollout.revision_history_limit]

    def roll_back(self, verdict: RolloutVerdict, why: str) -> None:
        # A paired promotion leaves its new slot behind: emptied, router first.
        retiring = self.status.slot.other if paired(self.status) else None
        self.update(
            phase=RolloutPhase.ROLLED_BACK,
            verdict=verdict,
            verdict_reason=why,
            rejected_revision=self.status.canary_revision,
            promoted_roles=(),
            pair_stage=None,
            retiring=retiring,
            message=f"rolled back ({verdict.value}): {why}",
        )
        self.events.append(("Warning", "RolledBack", f"{verdict.value}: {why}"))

    def release_retired_slot(self) -> None:
        """The slot a rolled-back paired promotion left: gone once its router is."""
        retiring = self.status.retiring
        if retiring is not None and retiring not in self.observed.routers_live:
            self.update(retiring=None, pair_step=0)

    # -- production watch ---------------------------------------------------------------
    def watch_production(self) -> None:
        """Record a finished watch run, and start the next one when it is due (one at a
        time; the interval counts from a run's start; the first run comes half an interval
        to one and a half after the phase's start, at the deployment's offset)."""
        watch = self.status.stable_probe
        outcome = self.observed.stable_probe
        if watch is not None and watch.pending and outcome is not None:
            verdict = watch_verdict(outcome)
            watch = watch.model_copy(
                update={
                    "verdict": verdict,
                    "verdict_of": watch.started_at,
                    "samples": outcome.samples,
                    "corrupt": outcome.corrupt,
                    "message": outcome.message or evidence_text(outcome),
                }
            )
            self.update(stable_probe=watch)
            self.update(history=self.watched_history(verdict, evidence_text(outcome)))
            if verdict is WatchVerdict.CORRUPT:
                self.events.append(("Warning", "StableCorruption", evidence_text(outcome)))
        interval = self.rollout.stable_probe_interval_seconds
        if not interval or self.observed.stable_probe_running:
            return
        if watch is not None:
            due = parse_stamp(watch.started_at).timestamp() + interval
        elif self.status.phase_since is not None:
            since = parse_stamp(self.status.phase_since).timestamp()
            due = first_due(since, interval, self.offset)
        else:
            return
        if self.observed.now.timestamp() >= due:
            started = watch or StableProbeStatus(started_at=self.now)
            self.update(stable_probe=started.model_copy(update={"started_at": self.now}))
            self.effects.append(Effect.START_STABLE_PROBE)

    def watched_history(self, verdict: WatchVerdict, evidence: str) -> tuple[PromotedRevision, ...]:
        """The serving revision's entry with a finished watch run counted: a run that judged
        samples, and the first corruption it found (which undo never returns to)."""
        history = self.status.history
        if not history or history[0].revision != self.status.stable_revision:
            return history  # a status an older operator wrote: nothing to count on
        head = history[0]
        if verdict is WatchVerdict.NO_EVIDENCE:
            return history
        changes: dict[str, object] = {"watch_runs": head.watch_runs + 1}
        if verdict is WatchVerdict.CORRUPT and head.corruption is None:
            changes["corruption"] = f"{evidence} (watch run of {self.now})"
        return (head.model_copy(update=changes), *history[1:])

    def waited(self, since: str | None = None) -> float:
        start = since or self.status.phase_since
        if start is None:
            return 0.0
        return (self.observed.now - parse_stamp(start)).total_seconds()


def watch_verdict(outcome: ProbeOutcome) -> WatchVerdict:
    """What a production watch run can claim: corruption, or none seen — never a PASS."""
    if outcome.verdict is RolloutVerdict.FAIL:
        return WatchVerdict.CORRUPT
    return WatchVerdict.CLEAN if outcome.samples else WatchVerdict.NO_EVIDENCE


def evidence_text(outcome: ProbeOutcome) -> str:
    if outcome.rate is None or outcome.bound is None:
        return f"{outcome.verdict.value} after {outcome.samples} samples"
    if outcome.threshold is None:
        bound = f"upper bound {outcome.bound:.3%}"
    else:
        shown, budget = percents(outcome.bound, outcome.threshold)
        bound = f"upper bound {shown}, budget {budget}"
    return (
        f"{outcome.verdict.value}: failure rate (corrupt or unanswered) {outcome.rate:.2%} ({bound}) "
        f"over {outcome.samples} samples"
    )


def flags_text(flags: EngineRevision) -> str:
    f = flags.features
    hicache = "on" if f.hicache.enabled else "off"
    image = flags.pinned_image
    return f"revision {flags.revision}: hicache={hicache} indexDtype={f.index_dtype.value} image={image}"


def changes_text(stable: EngineRevision, desired: EngineRevision, most: int = 6) -> str:
    """The engine fields a canary tests, as a person reads them in an Event."""
    changed = differences(stable.spec, desired.spec)
    shown = "; ".join(changed[:most]) + (
        f"; and {len(changed) - most} more" if len(changed) > most else ""
    )
    return shown or flags_text(desired)
