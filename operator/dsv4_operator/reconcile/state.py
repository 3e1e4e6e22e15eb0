"""What one reconcile pass knows, read once at its start: the one value every decision of
the pass is computed from (the resource, its spec, its previous status, its children, now)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.api.status import DSV4DeploymentStatus
from dsv4_operator.reconcile.blockers import Blocker, blockers
from dsv4_operator.render.meta import WORKLOAD_KINDS, Owner
from dsv4_operator.rollout.ledger import Ledger


@dataclass(frozen=True)
class PassState:
    owner: Owner
    obj: dict[str, Any]  # the DSV4Deployment as read (its resourceVersion guards the status)
    spec: DSV4DeploymentSpec
    previous: DSV4DeploymentStatus | None
    stable_live: list[dict[str, Any]]  # children of the stable slice (owned by this UID)
    canary_live: list[dict[str, Any]]  # children of the canary slice (owned by this UID)
    now: dt.datetime
    # Read only while a workload of either slice is not settled (`reconcile.blockers`):
    # the pods of both slices and the namespace's FailedCreate Events.
    pods: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    ledger: Ledger = field(default_factory=Ledger)  # revisions rejected under this name

    @property
    def workloads(self) -> list[dict[str, Any]]:
        """The engine workloads and router Deployments of both slices."""
        return [o for o in [*self.stable_live, *self.canary_live] if o["kind"] in WORKLOAD_KINDS]

    @property
    def blockers(self) -> list[Blocker]:
        """Why replicas of either slice are not coming up (empty when nothing was read)."""
        return blockers(self.workloads, self.pods, self.events)
