"""One reconcile pass: read → render → apply what differs → status → events.

Level-triggered: every pass starts from what the API server says now, so a pass can be
interrupted anywhere (operator killed, leadership lost) and the next one converges.
Children are keyed by name, so a rerun never duplicates them.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections import defaultdict
from typing import Any

from pydantic import ValidationError

from dsv4_engine.features import Role
from dsv4_operator import metrics
from dsv4_operator.api import API_VERSION, KIND
from dsv4_operator.api.errors import first_error
from dsv4_operator.api.rollout import FlagSet, RolloutStatus, RolloutVerdict
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.api.status import DSV4DeploymentStatus
from dsv4_operator.api.times import now_rfc3339
from dsv4_operator.reconcile.kube import ApiError, Kube
from dsv4_operator.reconcile.plan import Action, plan, with_applied_hash
from dsv4_operator.reconcile.status import Problem, decide_status, observe_roles
from dsv4_operator.render import render_all
from dsv4_operator.render.engine import feature_revision
from dsv4_operator.render.memory import MemorySizingError, pod_memory
from dsv4_operator.render.meta import LABEL_INSTANCE, Owner, instance_selector
from dsv4_operator.render.placement import GPU_PRODUCT_LABEL
from dsv4_operator.render.workloads import HostMemory
from dsv4_operator.rollout.controller import RolloutController, RolloutOutcome, RolloutSpecError
from dsv4_operator.rollout.decide import role_flags
from dsv4_operator.rollout.observe import rolled_roles
from dsv4_operator.rollout.slices import canary_owner, role_specs, spec_flags, with_flags

log = logging.getLogger("dsv4_operator.reconcile")

CHILD_KINDS = (
    "ConfigMap",
    "StatefulSet",
    "Service",
    "PodDisruptionBudget",
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "Deployment",
)


def parse_rollout(status: DSV4DeploymentStatus | None) -> RolloutStatus | None:
    """The rollout's memory; an unreadable one (hand-edited) is started afresh from the spec."""
    try:
        return RolloutStatus.model_validate(status.rollout) if status and status.rollout else None
    except ValidationError:
        log.warning("status.rollout is unreadable; adopting the spec's flags as stable")
        return None


def parse_status(raw: dict[str, Any] | None) -> DSV4DeploymentStatus | None:
    try:
        return DSV4DeploymentStatus.model_validate(raw) if raw else None
    except ValidationError:
        return None


def check_prerequisites(kube: Kube, namespace: str, spec: DSV4DeploymentSpec) -> Problem | None:
    products = ",".join(spec.placement.gpu_products)
    if not kube.list("Node", None, f"{GPU_PRODUCT_LABEL} in ({products})"):
        return Problem(
            "NoAllowedGPUNodes",
            f"no node has label {GPU_PRODUCT_LABEL} in spec.placement.gpuProducts [{products}]",
        )
    pvc = spec.model.pvc
    if pvc is not None and kube.get("PersistentVolumeClaim", namespace, pvc.claim_name) is None:
        return Problem(
            "PVCNotFound",
            f"spec.model.pvc.claimName: PersistentVolumeClaim {pvc.claim_name!r} "
            f"does not exist in namespace {namespace!r}",
        )
    return None


class Reconciler:
    """Serialises passes per DSV4Deployment; the blocking client runs in a worker thread."""

    def __init__(
        self,
        kube: Kube,
        rollout: RolloutController,
        host_memory: HostMemory = pod_memory,
    ) -> None:
        self.kube = kube
        self.rollout = rollout
        self.host_memory = host_memory
        self._locks: defaultdict[tuple[str, str], asyncio.Lock] = defaultdict(asyncio.Lock)

    async def reconcile(self, namespace: str, name: str) -> None:
        async with self._locks[(namespace, name)]:
            started = time.monotonic()
            try:
                await asyncio.to_thread(self.reconcile_now, namespace, name)
                metrics.RECONCILES.labels("ok").inc()
            except ApiError as err:
                # Retries are exhausted; the next event or resync pass tries again.
                metrics.RECONCILES.labels("error").inc()
                log.warning("reconcile of %s/%s failed: %s", namespace, name, err)
            finally:
                metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)

    def reconcile_now(self, namespace: str, name: str) -> None:
        obj = self.kube.get(KIND, namespace, name)
        if obj is None or obj["metadata"].get("deletionTimestamp"):
            return
        meta = obj["metadata"]
        owner = Owner(name=name, namespace=namespace, uid=meta["uid"])
        previous = parse_status(obj.get("status"))
        try:
            spec = DSV4DeploymentSpec.model_validate(obj.get("spec") or {})
        except ValidationError as err:
            self._report(obj, owner, previous, Problem("InvalidSpec", first_error(err)), [], [])
            return
        problem = check_prerequisites(self.kube, namespace, spec)
        live, canary_live = self._children(owner)
        actions: list[Action] = []
        rollout: RolloutOutcome | None = None
        if problem is None:
            try:
                rollout, current, rendered = self._rollout_step(
                    owner, obj, spec, previous, live, canary_live
                )
                # Most passes change no flags: the rendering made to observe is the desired one.
                desired = (
                    rendered
                    if rollout.flags == current
                    else self._render(owner, spec, rollout.flags)
                )
            except (RolloutSpecError, MemorySizingError) as err:
                problem, rollout = Problem("InvalidSpec", str(err)), None
        if rollout is not None:
            if rollout.status.stable_probe_verdict is RolloutVerdict.FAIL:
                problem = Problem(
                    "StableCorruption",
                    "the periodic probe of the promoted deployment FAILed; nothing was changed "
                    "automatically (see docs/runbook-canary-failed.md)",
                )
            actions = plan(desired, live)
            for action in actions:
                self._act(namespace, action)
        workloads = [o for o in live if o["kind"] in ("StatefulSet", "Deployment")]
        self._report(obj, owner, previous, problem, actions, workloads, spec, rollout)

    def _children(self, owner: Owner) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The stable children and the canary's, in one list request per kind for both: the
        steady-state pass is all reads, and each kind is read once."""
        canary = canary_owner(owner)
        found: dict[str, list[dict[str, Any]]] = {owner.name: [], canary.name: []}
        selector = instance_selector(owner, canary)
        for kind in CHILD_KINDS:
            for item in self.kube.list(kind, owner.namespace, selector):
                found[item["metadata"]["labels"][LABEL_INSTANCE]].append(item)
        return found[owner.name], found[canary.name]

    def _render(
        self, owner: Owner, spec: DSV4DeploymentSpec, flags: dict[Role, FlagSet]
    ) -> list[dict[str, Any]]:
        """The stable children, each role with the flags the rollout lets it run."""
        by_role = role_specs(spec, flags)
        base = with_flags(spec, flags[Role.DECODE])
        rendered = render_all(owner, base, self.host_memory, by_role)
        return [with_applied_hash(o) for o in rendered]

    def _rollout_step(
        self,
        owner: Owner,
        obj: dict[str, Any],
        spec: DSV4DeploymentSpec,
        previous: DSV4DeploymentStatus | None,
        live: list[dict[str, Any]],
        canary_live: list[dict[str, Any]],
    ) -> tuple[RolloutOutcome, dict[Role, FlagSet], list[dict[str, Any]]]:
        """The rollout's step, with the flags the stable roles ran before it and their
        rendering (what `rolled_roles` compares the live workloads against)."""
        before = parse_rollout(previous)
        current = {
            role: (role_flags(before, role) if before else spec_flags(spec)) for role in Role
        }
        rendered = self._render(owner, spec, current)
        outcome = self.rollout.step(
            owner,
            obj,
            spec,
            before,
            canary_live,
            rolled_roles(rendered, live),
            dt.datetime.now(dt.UTC),
        )
        return outcome, current, rendered

    def _act(self, namespace: str, action: Action) -> None:
        log.info(
            "%s %s/%s (%s)",
            action.verb,
            action.kind,
            action.name,
            action.reason,
            extra={"namespace": namespace, "verb": action.verb, "reason": action.reason},
        )
        if action.verb == "apply":
            assert action.obj is not None
            self.kube.apply(action.obj)
        else:
            self.kube.delete(action.kind, namespace, action.name)

    def _report(
        self,
        obj: dict[str, Any],
        owner: Owner,
        previous: DSV4DeploymentStatus | None,
        problem: Problem | None,
        actions: list[Action],
        workloads: list[dict[str, Any]],
        spec: DSV4DeploymentSpec | None = None,
        rollout: RolloutOutcome | None = None,
    ) -> None:
        # What the children run is the rollout's stable flags, not (yet) the spec's.
        features = rollout.status.stable.features if rollout else None
        status = decide_status(
            generation=obj["metadata"].get("generation", 0),
            features=features,
            revision=feature_revision(features) if features else None,
            roles=observe_roles(spec, workloads) if spec else {},
            problem=problem,
            applied=bool(actions),
            previous=previous,
            now=now_rfc3339(),
        )
        if rollout is not None:
            dumped = rollout.status.model_dump(mode="json", by_alias=True, exclude_none=True)
            status = status.model_copy(update={"rollout": dumped})
        if status != previous:
            body = {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "metadata": {"name": owner.name, "namespace": owner.namespace},
                "status": status.model_dump(mode="json", by_alias=True, exclude_none=True),
            }
            self.kube.apply(body, subresource="status")
        events = decision_events(actions, previous, status, problem)
        for event in [*events, *(rollout.events if rollout else ())]:
            self._event(obj, *event)

    def _event(self, obj: dict[str, Any], kind: str, reason: str, message: str) -> None:
        meta = obj["metadata"]
        stamp = now_rfc3339()
        self.kube.create(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
                "involvedObject": {
                    "apiVersion": API_VERSION,
                    "kind": KIND,
                    "name": meta["name"],
                    "namespace": meta["namespace"],
                    "uid": meta["uid"],
                },
                "type": kind,
                "reason": reason,
                "message": message[:1024],
                "source": {"component": "dsv4-operator"},
                "firstTimestamp": stamp,
                "lastTimestamp": stamp,
                "count": 1,
            }
        )


def decision_events(
    actions: list[Action],
    previous: DSV4DeploymentStatus | None,
    status: DSV4DeploymentStatus,
    problem: Problem | None,
) -> list[tuple[str, str, str]]:
    """(type, reason, message) of every decision this pass made; none when nothing changed."""
    events = [
        (
            "Normal",
            "Applied" if a.verb == "apply" else "Deleted",
            f"{a.kind} {a.name}: {a.reason}",
        )
        for a in actions
    ]
    before = previous.phase if previous else None
    if status.phase != before:
        kind = "Warning" if problem is not None else "Normal"
        reason = problem.reason if problem is not None else f"Phase{status.phase}"
        message = problem.message if problem is not None else f"phase {before} → {status.phase}"
        events.append((kind, reason, message))
    return events
