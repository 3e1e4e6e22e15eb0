"""The status a DSV4Deployment should show, from what its children report (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dsv4_engine.features import EngineFeatures, Role
from dsv4_operator.api.rollout import IN_PROGRESS, RolloutPhase, RolloutStatus
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.api.status import (
    Condition,
    ConditionType,
    DSV4DeploymentStatus,
    Phase,
    RoleStatus,
)
from dsv4_operator.api.times import parse_stamp
from dsv4_operator.reconcile.blockers import Blocker, blockers_text
from dsv4_operator.render.meta import ENGINE_KINDS, LABEL_COMPONENT, Owner
from dsv4_operator.render.workloads import serving_labels
from dsv4_operator.rollout.ledger import Rejection


@dataclass(frozen=True)
class Problem:
    """Why the operator cannot make the children right now (a `Degraded` reason)."""

    reason: str
    message: str


@dataclass(frozen=True)
class Pending:
    """The spec's engine flags are not the ones serving: a rollout is taking them through
    the canary (``rejected`` False), or the canary rejected them (True: nothing more
    happens until the spec changes or a person retries).  Either way the spec is not done,
    and GitOps tools must not read the deployment as healthy and in sync."""

    rejected: bool
    reason: str
    message: str


REJECTED = "RolloutRejected"


def spec_pending(
    rollout: RolloutStatus | None,
    desired_revision: str | None,
    rejected_before: Mapping[str, Rejection] | None = None,
) -> Pending | None:
    """Whether the rollout keeps the spec's flags (revision ``desired_revision``) from
    serving, and why; None when they serve.  ``rejected_before``: the revisions rejected
    under this name earlier (`rollout.ledger`), which stay rejected."""
    if rollout is None or desired_revision is None:
        return None
    if rollout.phase in IN_PROGRESS:
        why = rollout.message or f"flags {rollout.canary_revision}: {rollout.phase.value}"
        return Pending(False, f"Rollout{rollout.phase.value}", why)
    if rollout.phase is RolloutPhase.ROLLED_BACK and rollout.rejected_revision == desired_revision:
        verdict = rollout.verdict.value if rollout.verdict else "rejected"
        return Pending(
            True,
            REJECTED,
            f"the canary rejected flags {desired_revision} ({verdict}): "
            f"{rollout.verdict_reason or rollout.message}; the stable flags "
            f"{rollout.stable_revision} serve until the spec changes or `dsv4ctl rollout "
            "retry` is run",
        )
    earlier = (rejected_before or {}).get(desired_revision)
    if earlier is not None and rollout.stable_revision != desired_revision:
        return Pending(
            True,
            REJECTED,
            f"flags {desired_revision} were rejected earlier ({earlier.text()}); the stable "
            f"flags {rollout.stable_revision} serve until the spec changes or `dsv4ctl "
            "rollout retry` is run",
        )
    return None


def workload_progress(obj: dict[str, Any]) -> tuple[int, int]:
    """(ready, updated) replicas of a workload; updated counts only once its controller has
    seen the latest spec.  A StatefulSet or Deployment counts pods, one per replica; a
    LeaderWorkerSet counts groups, and a group is ready only when all its pods are."""
    status = obj.get("status") or {}
    ready = status.get("readyReplicas", 0)
    current = status.get("observedGeneration", 0) >= obj["metadata"].get("generation", 0)
    updated = status.get("updatedReplicas", 0) if current else 0
    return ready, updated


def role_status(
    desired: int, workloads: list[dict[str, Any]], selector: str | None = None
) -> RoleStatus:
    """Replicas (not pods) of a role, summed over its slots' workloads: during a paired
    promotion both slots serve, and each counts what it has."""
    counts = [workload_progress(w) for w in workloads]
    ready, updated = sum(c[0] for c in counts), sum(c[1] for c in counts)
    summary = f"{ready}/{desired}"
    return RoleStatus(
        desired=desired, ready=ready, updated=updated, summary=summary, selector=selector
    )


def observe_roles(
    spec: DSV4DeploymentSpec, workloads: list[dict[str, Any]], owner: Owner
) -> dict[str, RoleStatus]:
    def component(name: str) -> list[dict[str, Any]]:
        return [w for w in workloads if w["metadata"]["labels"].get(LABEL_COMPONENT) == name]

    roles: dict[str, RoleStatus] = {}
    for role in Role:
        engines = [w for w in component(role.value) if w["kind"] in ENGINE_KINDS]
        serving = ",".join(f"{k}={v}" for k, v in serving_labels(owner, role).items())
        roles[role.value] = role_status(spec.role_spec(role).replicas, engines, serving)
    roles["router"] = role_status(spec.router.replicas, component("router"))
    return roles


def _condition(
    ctype: ConditionType,
    true: bool,
    reason: str,
    message: str,
    generation: int,
    previous: DSV4DeploymentStatus | None,
    now: str,
) -> Condition:
    status = "True" if true else "False"
    before = next((c for c in previous.conditions if c.type == ctype), None) if previous else None
    since = before.last_transition_time if before and before.status == status else now
    return Condition(
        type=ctype,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=since,
        observed_generation=generation,
    )


# Progressing's reason while the replicas simply are not there yet (nothing reported why).
ROLLING = "Rollout"
DEADLINE = "ProgressDeadlineExceeded"


def _progressed(
    previous: DSV4DeploymentStatus | None, generation: int, roles: dict[str, RoleStatus]
) -> bool:
    """Something moved since the last status: a new spec, or more ready or updated replicas
    of some role (what resets the progress deadline, as a Deployment's new pods do)."""
    if previous is None or previous.last_progress_time is None:
        return True
    if previous.observed_generation != generation:
        return True
    for name, now in roles.items():
        before = getattr(previous, name, None)
        if before is None or now.ready > before.ready or now.updated > before.updated:
            return True
    return False


def deadline_left(status: DSV4DeploymentStatus, deadline_seconds: int, now: str) -> float | None:
    """Seconds until a Progressing deployment passes its progress deadline (None: not
    progressing); when the reconciler should look again even if nothing happens."""
    if status.phase is not Phase.PROGRESSING or status.last_progress_time is None:
        return None
    waited = (parse_stamp(now) - parse_stamp(status.last_progress_time)).total_seconds()
    return max(0.0, deadline_seconds - waited)


def decide_status(
    *,
    generation: int,
    features: EngineFeatures | None,
    revision: str | None,
    roles: dict[str, RoleStatus],
    problem: Problem | None,
    applied: bool,
    previous: DSV4DeploymentStatus | None,
    now: str,
    blockers: list[Blocker] | None = None,
    progress_deadline_seconds: int | None = None,
    pending: Pending | None = None,
) -> DSV4DeploymentStatus:
    """Phase and conditions.  `applied`: this pass changed children, so they are not
    settled whatever their status says.  `blockers`: why replicas are not coming up, in
    Kubernetes' words (`reconcile.blockers`).  A role that has not progressed for
    `progress_deadline_seconds` makes the deployment Degraded (`ProgressDeadlineExceeded`).
    `pending`: the spec's flags do not serve yet (`spec_pending`), so settled replicas are
    not Ready: Progressing while the rollout runs (its own timeouts bound it, not the
    progress deadline), Degraded once the canary rejected them.  Reconciling and Stalled
    repeat Progressing and Degraded for kstatus readers.  A timestamp moves only when a
    condition flips or progress is seen, so an unchanged world gives an equal status (and
    no write)."""
    blockers = blockers or []
    settled = not applied and all(r.ready == r.updated == r.desired for r in roles.values())
    last_progress_time = None
    runs_now = problem is None  # an outside problem: the children still run the old flags
    if problem is None and not settled:
        moved = applied or _progressed(previous, generation, roles)
        last_progress_time = now if moved or previous is None else previous.last_progress_time
        waiting = ", ".join(f"{n} {r.ready}/{r.desired}" for n, r in roles.items())
        why = f"waiting for ready and updated replicas: {waiting}"
        if blockers:
            why += f"; {blockers_text(blockers)}"
        waited = (parse_stamp(now) - parse_stamp(last_progress_time or now)).total_seconds()
        if progress_deadline_seconds is not None and waited > progress_deadline_seconds:
            problem = Problem(
                DEADLINE,
                f"no progress for {progress_deadline_seconds}s (spec.progressDeadlineSeconds): "
                f"{why}",
            )
        else:
            phase = Phase.PROGRESSING
            progress = (True, blockers[0].reason if blockers else ROLLING, why)
    if problem is not None:
        phase = Phase.DEGRADED
        progress = (False, problem.reason, problem.message)
    elif settled and pending is not None and pending.rejected:
        phase = Phase.DEGRADED
        problem = Problem(pending.reason, pending.message)
        progress = (False, pending.reason, pending.message)
    elif settled and pending is not None:
        phase = Phase.PROGRESSING
        progress = (True, pending.reason, pending.message)
    elif settled:
        phase = Phase.READY
        progress = (False, "Settled", "every replica runs the current spec")

    conditions = (
        _condition(
            ConditionType.READY,
            phase is Phase.READY,
            "Ready" if phase is Phase.READY else phase.value,
            "all roles ready" if phase is Phase.READY else progress[2],
            generation,
            previous,
            now,
        ),
        _condition(ConditionType.PROGRESSING, *progress, generation, previous, now),
        _condition(
            ConditionType.DEGRADED,
            problem is not None,
            problem.reason if problem else "AsExpected",
            problem.message if problem else "",
            generation,
            previous,
            now,
        ),
    )
    progressing, degraded = conditions[1], conditions[2]
    conditions += tuple(
        _condition(ctype, c.status == "True", c.reason, c.message, generation, previous, now)
        for ctype, c in (
            (ConditionType.RECONCILING, progressing),
            (ConditionType.STALLED, degraded),
        )
    )
    if not runs_now:
        # Degraded by a problem outside the children: they still run what they ran before
        # (nothing, the first time).
        revision = previous.engine_revision if previous else None
        features = previous.active_features if previous else None
    return DSV4DeploymentStatus(
        observed_generation=generation,
        phase=phase,
        conditions=conditions,
        prefill=roles.get("prefill"),
        decode=roles.get("decode"),
        router=roles.get("router"),
        engine_revision=revision,
        active_features=features,
        last_progress_time=last_progress_time,
        rollout=previous.rollout if previous else None,
    )
