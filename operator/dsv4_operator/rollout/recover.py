"""Rebuild a lost `status.rollout` from the live children and the report ConfigMaps.

Pure.  The rule is never to trust the spec — it holds exactly the flags not yet proven:
- the stable flags are what the children record as stable (`record`);
- a role running other flags was mid-promotion: resumed only if a canary report of those
  flags says PASS, otherwise those flags are rejected and the role rolls back;
- a live canary slice restarts its readiness wait (a new probe attempt), unless its revision
  is already judged: a filed FAIL (or any verdict but PASS) stays that verdict;
- a rejection stays a rejection, wherever it is recorded: on the children, in the ledger
  (an aborted or timed-out promotion is never resumed), or in a non-PASS report;
- a PASS report proves a revision only as re-checked by the caller (`reports.checked`);
- the attempt counter continues after the highest attempt any report carries, so no
  attempt can read a report filed before the loss.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from dsv4_engine.features import Role
from dsv4_operator.api.rollout import (
    EngineRevision,
    PairStage,
    Promotion,
    RolloutPhase,
    RolloutStatus,
    RolloutVerdict,
    Slot,
    Transfer,
)
from dsv4_operator.api.times import stamp
from dsv4_operator.rollout.ledger import Ledger
from dsv4_operator.rollout.record import Record, role_of, slot_of
from dsv4_operator.rollout.reports import FiledReport


class Unrecoverable(Exception):
    """The children do not say enough to rebuild the rollout safely; the message says why."""


class RevisionRejected(Exception):
    """Nothing serves yet and the spec asks for a revision rejected under this name before
    (`rollout.ledger`): it is not adopted as stable; the message says why and what to do."""


@dataclass(frozen=True)
class Recovered:
    status: RolloutStatus
    summary: str  # what was rebuilt, for the Event


def recover(
    stable_live: list[dict[str, Any]],
    canary_live: list[dict[str, Any]],
    reports: list[FiledReport],
    ledger: Ledger,
    now: dt.datetime,
) -> Recovered | None:
    """The rebuilt status; None when no stable workload exists (nothing serves users yet).
    ``reports`` are the deployment's filed reports, each PASS already re-checked."""
    slots: dict[Slot, dict[Role, dict[str, Any]]] = {}
    for workload in stable_live:
        role = role_of(workload)
        if role is not None:
            slots.setdefault(slot_of(workload), {})[role] = workload
    if not slots:
        return None
    records = [Record.of(w) for roles in slots.values() for w in roles.values()]
    missing = [r.name for r in records if r.stable is None or r.runs is None]
    if missing:
        raise Unrecoverable(
            f"status.rollout is lost and StatefulSet {', '.join(missing)} carries no readable "
            "flags record (made by an older operator?); restore status.rollout, or delete the "
            "workloads to start afresh from the spec"
        )
    stable = _stable(records)
    rejected = next((r.rejected for r in records if r.rejected), None)
    judged = _Judged(reports, ledger, rejected)
    at = stamp(now)
    active = next(
        (slot for slot, roles in slots.items() if all(Record.of(w).runs == stable for w in roles.values())),
        next(iter(slots)),
    )  # fmt: skip
    base = RolloutStatus(
        stable=stable,
        stable_revision=stable.revision,
        slot=active,
        phase_since=at,
        probe_attempt=max((r.attempt for r in reports if r.target == "canary"), default=0),
        rejected_revision=rejected,
    )
    if len(slots) > 1:
        return _mid_paired(base, slots[active.other], judged, at)
    runs = {role: Record.of(w).runs for role, w in slots[active].items()}
    promoted = {role for role, flags in runs.items() if flags != stable}
    if promoted:
        return _mid_promotion(base, runs, promoted, judged, at)
    canary = [Record.of(w).runs for w in canary_live if role_of(w) is not None]
    if canary and canary[0] is not None:
        flags = canary[0]
        against = judged.against(flags.revision)
        if against is not None:
            return _rejected(base, flags, against, at, "canary")
        status = base.model_copy(
            update={
                "phase": RolloutPhase.CANARY_STARTING,
                "canary": flags,
                "canary_revision": flags.revision,
                "started_at": at,
                "rejected_revision": None,
                "message": f"canary {flags.revision} found live; waiting for it to be Ready",
            }
        )
        return Recovered(status, f"canary of flags {flags.revision} resumed from the start")
    if rejected is not None:
        against = judged.against(rejected)
        assert against is not None  # the children's record is one of its sources
        status = base.model_copy(
            update={
                "phase": RolloutPhase.ROLLED_BACK,
                "verdict": against.verdict,
                "report": against.report,
                "message": f"flags {rejected} stay rejected ({against.source})",
            }
        )
        return Recovered(status, f"stable flags {stable.revision}, flags {rejected} rejected")
    return Recovered(base, f"stable flags {stable.revision}")


@dataclass(frozen=True)
class Against:
    """Why a revision stays rejected: the verdict, its report (if any) and where it is
    recorded."""

    verdict: RolloutVerdict | None
    report: str | None
    source: str


@dataclass(frozen=True)
class _Judged:
    """Every record of a judgement the cluster keeps: the reports, the ledger and the
    children's rejected revision."""

    reports: list[FiledReport]
    ledger: Ledger
    recorded: str | None  # the rejected revision the children record

    def against(self, revision: str) -> Against | None:
        """Why ``revision`` is rejected, or None when nothing rejects it.  A filed verdict
        other than PASS is final (a FAIL stays FAIL, even beside a later PASS); the ledger
        keeps the rejections no report shows (aborted, timed out)."""
        failed = [
            r
            for r in self.reports
            if r.target == "canary"
            and r.revision == revision
            and r.outcome is not None
            and r.outcome.verdict is not RolloutVerdict.PASS
        ]
        entry = self.ledger.rejected.get(revision)
        if failed:
            first = min(failed, key=lambda r: (r.created, r.attempt))
            assert first.outcome is not None
            said = f": {first.outcome.message}" if first.outcome.message else ""
            return Against(first.outcome.verdict, first.name, f"report {first.name}{said}")
        if entry is not None:
            verdict = next((v for v in RolloutVerdict if v.value == entry.verdict), None)
            return Against(verdict, entry.report, f"ledger: {entry.text()}")
        if revision == self.recorded:
            return Against(None, None, "recorded on the children")
        return None

    def passed(self, revision: str) -> FiledReport | None:
        """The newest PASS report of ``revision``, if nothing rejects it."""
        if self.against(revision) is not None:
            return None
        return _newest(self.reports, revision, RolloutVerdict.PASS)


def _stable(records: list[Record]) -> EngineRevision:
    """The recorded stable flags.  Workloads disagree only when a pass died between their
    applies; then the flags that every workload already runs are the newer record."""
    candidates = {r.stable.revision: r.stable for r in records if r.stable is not None}
    if len(candidates) == 1:
        return next(iter(candidates.values()))
    for flags in candidates.values():
        if all(r.runs == flags for r in records):
            return flags
    raise Unrecoverable(
        "status.rollout is lost and the workloads record different stable flags "
        f"({', '.join(sorted(candidates))}); restore status.rollout"
    )


def _mid_paired(
    base: RolloutStatus,
    new_slot: dict[Role, dict[str, Any]],
    judged: _Judged,
    at: str,
) -> Recovered:
    """Engines in both slots: a paired promotion was under way.  It resumes where the new
    slot's replica counts say, or the new slot is emptied."""
    runs = [Record.of(w).runs for w in new_slot.values()]
    flags = runs[0]
    if flags is None or any(r != flags for r in runs):
        raise Unrecoverable("status.rollout is lost and the second slot runs mixed flags")
    step = max(1, *(int(w.get("spec", {}).get("replicas", 0)) for w in new_slot.values()))
    same = flags.transfer_key == base.stable.transfer_key
    both = {
        "transfer": Transfer.COMPATIBLE if same else Transfer.INCOMPATIBLE,
        "promotion": Promotion.SURGE,
        "pair_step": step,
    }
    return _resume_or_reject(
        base,
        flags,
        judged,
        at,
        "paired promotion",
        resumed={**both, "pair_stage": PairStage.GROW},
        rejected={**both, "retiring": base.slot.other},
    )


def _mid_promotion(
    base: RolloutStatus,
    runs: dict[Role, EngineRevision | None],
    promoted: set[Role],
    judged: _Judged,
    at: str,
) -> Recovered:
    """A role runs other flags than the stable ones: a role-by-role promotion."""
    news = {flags.revision: flags for role, flags in runs.items() if role in promoted and flags}
    if len(news) != 1:
        raise Unrecoverable(
            f"status.rollout is lost and the roles run {len(news)} different new flag sets"
        )
    flags = next(iter(news.values()))
    resumed = {"promoted_roles": tuple(sorted(promoted)), "promotion": Promotion.IN_PLACE}
    return _resume_or_reject(base, flags, judged, at, "promotion", resumed, rejected={})


def _resume_or_reject(
    base: RolloutStatus,
    flags: EngineRevision,
    judged: _Judged,
    at: str,
    what: str,
    resumed: dict[str, Any],
    rejected: dict[str, Any],
) -> Recovered:
    """A promotion found half done continues only if a (re-checked) canary report proves
    its flags (PASS) and nothing rejects them; otherwise production returns to the stable
    flags."""
    revision = flags.revision
    common = {"canary": flags, "canary_revision": revision, "started_at": at}
    passed = judged.passed(revision)
    if passed is not None and passed.outcome is not None:
        outcome = passed.outcome
        status = base.model_copy(
            update={
                **common,
                **resumed,
                "phase": RolloutPhase.PROMOTING,
                "verdict": RolloutVerdict.PASS,
                "rate": outcome.rate,
                "bound": outcome.bound,
                "samples": outcome.samples,
                "report": passed.name,
                "rejected_revision": None,
                "message": f"{what} of flags {revision} resumed (PASS report {passed.name})",
            }
        )
        return Recovered(status, f"{what} of flags {revision} resumed")
    against = judged.against(revision)
    if against is not None:
        return _rejected(base.model_copy(update=rejected), flags, against, at, what)
    unproven = _newest(judged.reports, revision)
    why = (
        f"report {unproven.name}: {unproven.outcome.message}"
        if unproven is not None and unproven.outcome is not None
        else "no PASS report proves them"
    )
    reason = f"status.rollout was lost during the {what} of flags {revision} and {why}"
    status = base.model_copy(
        update={
            **common,
            **rejected,
            "phase": RolloutPhase.ROLLED_BACK,
            "verdict": RolloutVerdict.INCONCLUSIVE,
            "verdict_reason": reason,
            "rejected_revision": revision,
            "report": unproven.name if unproven is not None else None,
            "message": f"rolled back (INCONCLUSIVE): {reason}",
        }
    )
    return Recovered(status, f"flags {revision} had no PASS report; rolled back")


def _rejected(
    base: RolloutStatus, flags: EngineRevision, against: Against, at: str, what: str
) -> Recovered:
    """``flags`` found live (a canary, a promotion: ``what``) after they were rejected:
    rolled back again, with the verdict that rejected them."""
    revision = flags.revision
    verdict = against.verdict.value if against.verdict else "rejected"
    reason = (
        f"status.rollout was lost during the {what} of flags {revision}, which stay "
        f"rejected ({against.source})"
    )
    status = base.model_copy(
        update={
            "canary": flags,
            "canary_revision": revision,
            "started_at": at,
            "phase": RolloutPhase.ROLLED_BACK,
            "verdict": against.verdict,
            "verdict_reason": reason,
            "rejected_revision": revision,
            "report": against.report,
            "message": f"rolled back ({verdict}): {reason}",
        }
    )
    return Recovered(status, f"{what} of flags {revision} stays rejected ({against.source})")


def _newest(
    reports: list[FiledReport], revision: str, verdict: RolloutVerdict | None = None
) -> FiledReport | None:
    found = [
        r
        for r in reports
        if r.target == "canary"
        and r.revision == revision
        and r.outcome is not None
        and (verdict is None or r.outcome.verdict is verdict)
    ]
    return max(found, key=lambda r: (r.created, r.attempt), default=None)
