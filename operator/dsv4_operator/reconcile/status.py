"""The status a DSV4Deployment should show, from what its children report (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dsv4_engine.features import EngineFeatures, Role
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.api.status import (
    Condition,
    ConditionType,
    DSV4DeploymentStatus,
    Phase,
    RoleStatus,
)
from dsv4_operator.render.meta import LABEL_COMPONENT, LABEL_GROUP_ROLE


@dataclass(frozen=True)
class Problem:
    """Why the operator cannot make the children right now (a `Degraded` reason)."""

    reason: str
    message: str


def _set_progress(obj: dict[str, Any]) -> tuple[int, int]:
    """(ready, updated) pods of a StatefulSet or Deployment; updated counts only once the
    controller has seen the latest spec."""
    status = obj.get("status") or {}
    ready = status.get("readyReplicas", 0)
    current = status.get("observedGeneration", 0) >= obj["metadata"].get("generation", 0)
    updated = status.get("updatedReplicas", 0) if current else 0
    return ready, updated


def role_status(desired: int, nodes: int, sets: list[dict[str, Any]]) -> RoleStatus:
    """Replicas (not pods) of a role: a multi-node replica counts once all its pods do."""
    ready = updated = desired
    leaders = [s for s in sets if s["metadata"]["labels"].get(LABEL_GROUP_ROLE) != "worker"]
    workers = [s for s in sets if s not in leaders]
    for group, per_replica in ((leaders, 1), (workers, nodes - 1)):
        if per_replica == 0:
            continue
        if not group:
            ready = updated = 0
            continue
        pods_ready, pods_updated = _set_progress(group[0])
        ready = min(ready, pods_ready // per_replica)
        updated = min(updated, pods_updated // per_replica)
    return RoleStatus(desired=desired, ready=ready, updated=updated, summary=f"{ready}/{desired}")


def observe_roles(
    spec: DSV4DeploymentSpec, workloads: list[dict[str, Any]]
) -> dict[str, RoleStatus]:
    def component(name: str) -> list[dict[str, Any]]:
        return [w for w in workloads if w["metadata"]["labels"].get(LABEL_COMPONENT) == name]

    roles: dict[str, RoleStatus] = {}
    for role in Role:
        role_spec = spec.role_spec(role)
        sets = [w for w in component(role.value) if w["kind"] == "StatefulSet"]
        roles[role.value] = role_status(role_spec.replicas, role_spec.nodes_per_replica, sets)
    roles["router"] = role_status(spec.router.replicas, 1, component("router"))
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
) -> DSV4DeploymentStatus:
    """Phase and conditions.  `applied`: this pass changed children, so they are not
    settled whatever their status says.  A timestamp moves only when a condition flips,
    so an unchanged world gives an equal status (and no write)."""
    settled = not applied and all(r.ready == r.updated == r.desired for r in roles.values())
    if problem is not None:
        phase = Phase.DEGRADED
        progress = (False, problem.reason, problem.message)
    elif settled:
        phase = Phase.READY
        progress = (False, "Settled", "every replica runs the current spec")
    else:
        phase = Phase.PROGRESSING
        waiting = ", ".join(f"{n} {r.ready}/{r.desired}" for n, r in roles.items())
        progress = (True, "Rollout", f"waiting for ready and updated replicas: {waiting}")

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
    if problem is not None:
        # Degraded: the children still run what they ran before (nothing, the first time).
        revision = previous.feature_revision if previous else None
        features = previous.active_features if previous else None
    return DSV4DeploymentStatus(
        observed_generation=generation,
        phase=phase,
        conditions=conditions,
        prefill=roles.get("prefill"),
        decode=roles.get("decode"),
        router=roles.get("router"),
        feature_revision=revision,
        active_features=features,
        rollout=previous.rollout if previous else None,
    )
