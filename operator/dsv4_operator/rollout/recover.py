"""Rebuild a lost `status.rollout` from the live children and the report ConfigMaps.

Pure.  The rule is never to trust the spec — it holds exactly the flags not yet proven:
- the stable flags are what the children record as stable (`record`);
- a role running other flags was mid-promotion: resumed only if a canary report of those
  flags says PASS, otherwise those flags are rejected and the role rolls back;
- a live canary slice restarts its readiness wait (a new probe attempt, never an old report);
- a rejection recorded on the children stays a rejection (sticky reject survives);
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
    RolloutPhase,
    RolloutStatus,
    RolloutVerdict,
    Slot,
    Transfer,
)
from dsv4_operator.api.times import stamp
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
    now: dt.datetime,
) -> Recovered | None:
    """The rebuilt status; None when no stable workload exists (nothing serves users yet)."""
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
        return _mid_paired(base, slots[active.other], reports, at)
    runs = {role: Record.of(w).runs for role, w in slots[active].items()}
    promoted = {role for role, flags in runs.items() if flags != stable}
    if promoted:
        return _mid_promotion(base, runs, promoted, reports, at)
    canary = [Record.of(w).runs for w in canary_live if role_of(w) is not None]
    if canary and canary[0] is not None:
        flags = canary[0]
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
        last = _newest(reports, rejected)
        verdict = last.outcome.verdict if last and last.outcome else None
        status = base.model_copy(
            update={
                "phase": RolloutPhase.ROLLED_BACK,
                "verdict": verdict,
                "report": last.name if last else None,
                "message": f"flags {rejected} stay rejected (recorded on the children)",
            }
        )
        return Recovered(status, f"stable flags {stable.revision}, flags {rejected} rejected")
    return Recovered(base, f"stable flags {stable.revision}")


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
    reports: list[FiledReport],
    at: str,
) -> Recovered:
    """Engines in both slots: a paired promotion was under way.  It resumes where the new
    slot's replica counts say, or the new slot is emptied."""
    runs = [Record.of(w).runs for w in new_slot.values()]
    flags = runs[0]
    if flags is None or any(r != flags for r in runs):
        raise Unrecoverable("status.rollout is lost and the second slot runs mixed flags")
    step = max(1, *(int(w.get("spec", {}).get("replicas", 0)) for w in new_slot.values()))
    both = {"transfer": Transfer.INCOMPATIBLE, "pair_step": step}
    return _resume_or_reject(
        base,
        flags,
        reports,
        at,
        "paired promotion",
        resumed={**both, "pair_stage": PairStage.GROW},
        rejected={**both, "retiring": base.slot.other},
    )


def _mid_promotion(
    base: RolloutStatus,
    runs: dict[Role, EngineRevision | None],
    promoted: set[Role],
    reports: list[FiledReport],
    at: str,
) -> Recovered:
    """A role runs other flags than the stable ones: a role-by-role promotion."""
    news = {flags.revision: flags for role, flags in runs.items() if role in promoted and flags}
    if len(news) != 1:
        raise Unrecoverable(
            f"status.rollout is lost and the roles run {len(news)} different new flag sets"
        )
    flags = next(iter(news.values()))
    resumed = {"promoted_roles": tuple(sorted(promoted))}
    return _resume_or_reject(base, flags, reports, at, "promotion", resumed, rejected={})


def _resume_or_reject(
    base: RolloutStatus,
    flags: EngineRevision,
    reports: list[FiledReport],
    at: str,
    what: str,
    resumed: dict[str, Any],
    rejected: dict[str, Any],
) -> Recovered:
    """A promotion found half done continues only if a canary report proves its flags
    (PASS); otherwise they are rejected and production returns to the stable flags."""
    revision = flags.revision
    common = {"canary": flags, "canary_revision": revision, "started_at": at}
    passed = _newest(reports, revision, RolloutVerdict.PASS)
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
    status = base.model_copy(
        update={
            **common,
            **rejected,
            "phase": RolloutPhase.ROLLED_BACK,
            "verdict": RolloutVerdict.INCONCLUSIVE,
            "rejected_revision": revision,
            "message": f"rolled back (INCONCLUSIVE): status.rollout was lost during the {what} "
            f"of flags {revision} and no PASS report proves them",
        }
    )
    return Recovered(status, f"flags {revision} had no PASS report; rolled back")


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
