"""One reconcile pass: read → decide → record the decision in the status → write the
children → carry out the rollout's effects → Events.

Level-triggered: every pass starts from what the world looks like now (`PassState`, built
once) — read from the watch-fed caches (`kube.cache`), so a steady-state pass sends no
request at all — and a pass can be interrupted anywhere (operator killed, leadership lost)
and the next one converges.  A cache may lag; the order is what makes that safe too:
- the status — with the rollout's decision — is written first, with the resourceVersion the
  pass read as a precondition: if anything changed the resource meanwhile (a spec edit, an
  abort annotation), the write is refused, nothing was acted on, and the pass runs again
  on what is there now;
- then the stable and the canary children, planned together and written through one path
  (`_act`: its log line and request counter for every write; every write is remembered
  until the cache shows it, `reconcile.expectations`);
- then the probes and the handled annotation;
- then one Event per decision — the children written are one Event, not one each.
Children are keyed by name and matched by their owner's UID: a rerun never duplicates them,
and an object another owner holds is never adopted, patched or deleted.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from pydantic import ValidationError

from dsv4_engine.features import Role
from dsv4_operator import metrics
from dsv4_operator.api import KIND
from dsv4_operator.api.allowed import SHIPPED, Allowed
from dsv4_operator.api.errors import first_error
from dsv4_operator.api.host_paths import host_path_problem
from dsv4_operator.api.names import name_problem
from dsv4_operator.api.rollout import (
    EngineRevision,
    RolloutPhase,
    RolloutStatus,
    RolloutVerdict,
    Slot,
    WatchVerdict,
)
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.api.status import Condition, ConditionType, DSV4DeploymentStatus, Phase
from dsv4_operator.api.times import parse_stamp, stamp
from dsv4_operator.kube.cache import Reader
from dsv4_operator.kube.client import ApiError, Kube
from dsv4_operator.kube.json_patch import json_patch
from dsv4_operator.reconcile.blockers import (
    FAILED_CREATE,
    FAILED_CREATE_SELECTOR,
    UNSCHEDULABLE,
    Blocker,
    blockers_text,
)
from dsv4_operator.reconcile.desired import Desired, RenderMemory
from dsv4_operator.reconcile.events import EventRecorder
from dsv4_operator.reconcile.expectations import Expectations, Write
from dsv4_operator.reconcile.plan import Action, plan
from dsv4_operator.reconcile.specs import ParsedSpec, SpecMemory
from dsv4_operator.reconcile.state import PassState
from dsv4_operator.reconcile.status import (
    DEADLINE,
    ROLLING,
    Problem,
    deadline_left,
    decide_status,
    observe_roles,
    spec_pending,
)
from dsv4_operator.reconcile.watches import CHILD_KINDS
from dsv4_operator.render.lws import LWS_API_VERSION, LWS_KIND
from dsv4_operator.render.memory import MemorySizingError, pod_memory
from dsv4_operator.render.meta import (
    LABEL_INSTANCE,
    WORKLOAD_KINDS,
    Owner,
    instance_selector,
    pod_selector,
)
from dsv4_operator.render.placement import GPU_PRODUCT_LABEL, named_tolerations
from dsv4_operator.render.router import router_name
from dsv4_operator.render.workloads import HostMemory
from dsv4_operator.rollout import manual
from dsv4_operator.rollout.controller import RolloutController, probes_hicache
from dsv4_operator.rollout.decide import Decision, Manual, ManualAction, decide, first_status
from dsv4_operator.rollout.ledger import Ledger, Rejection, ledger_config_map, ledger_name
from dsv4_operator.rollout.migrate import upgraded
from dsv4_operator.rollout.observe import rolled_roles, settled, settled_slots
from dsv4_operator.rollout.record import recorded_revisions
from dsv4_operator.rollout.recover import RevisionRejected, Unrecoverable, recover
from dsv4_operator.rollout.reports import FiledReport, Trust, report_selector
from dsv4_operator.rollout.slices import canary_owner
from dsv4_operator.spread import phase

log = logging.getLogger("dsv4_operator.reconcile")

# A status write refused because the resource changed is redone on what is there now (read
# from the API server: the cache had not seen the change); a resource changing this often
# under every pass is left to the next event.
STATUS_ATTEMPTS = 3


class StatusConflict(Exception):
    """The resource changed between the pass's read and its status write."""


def parse_status(raw: dict[str, Any] | None) -> DSV4DeploymentStatus | None:
    try:
        return DSV4DeploymentStatus.model_validate(raw) if raw else None
    except ValidationError:
        return None


def parse_rollout(
    status: DSV4DeploymentStatus | None, spec: DSV4DeploymentSpec
) -> RolloutStatus | None:
    """The rollout's memory (one an older operator wrote, upgraded: `rollout.migrate`);
    None when missing or unreadable (then it is rebuilt)."""
    if not status or not status.rollout:
        return None
    try:
        return RolloutStatus.model_validate(upgraded(status.rollout, spec))
    except ValueError as err:  # pydantic's ValidationError is one
        log.warning("status.rollout is unreadable (%s); rebuilding it from the children", err)
        return None


def check_prerequisites(
    cache: Reader,
    namespace: str,
    spec: DSV4DeploymentSpec,
    allowed: Allowed = SHIPPED,
    unserved: frozenset[str] = frozenset(),
) -> Problem | None:
    """What must hold before any child is written: the model's source, the images, the
    tolerations, the device resources and the priority class are allowed (``allowed``: what the administrator allows, `api.allowed`;
    the admission fence would refuse the children otherwise), the model exists, some node
    has an allowed GPU, and a multi-node role's LeaderWorkerSet API is served
    (``unserved``: child kinds the API server does not know)."""
    if spec.model.host_path is not None:
        refused = host_path_problem(spec.model.host_path, namespace, allowed.model_host_paths)
        if refused is not None:
            return Problem("HostPathNotAllowed", refused)
    refused = allowed.image_problem(spec.named_images())
    if refused is not None:
        return Problem("ImageNotAllowed", refused)
    refused = allowed.toleration_problem(named_tolerations(spec.placement))
    if refused is not None:
        return Problem("TolerationNotAllowed", refused)
    refused = allowed.device_problem(spec.named_devices())
    if refused is not None:
        return Problem("DeviceNotAllowed", refused)
    refused = allowed.priority_class_problem(spec.placement.priority_class_name)
    if refused is not None:
        return Problem("PriorityClassNotAllowed", refused)
    if LWS_KIND in unserved:
        multi = next((r for r in Role if spec.role_spec(r).nodes_per_replica > 1), None)
        if multi is not None:
            nodes = spec.role_spec(multi).nodes_per_replica
            return Problem(
                "LeaderWorkerSetMissing",
                f"spec.{multi.value}.nodesPerReplica: {nodes} nodes per replica run as a "
                f"LeaderWorkerSet group, but this cluster does not serve {LWS_API_VERSION}; "
                "install LeaderWorkerSet (kubernetes-sigs/lws) or use nodesPerReplica 1",
            )
    products = ",".join(spec.placement.gpu_products)
    if not cache.exists("Node", None, f"{GPU_PRODUCT_LABEL} in ({products})"):
        return Problem(
            "NoAllowedGPUNodes",
            f"no node has label {GPU_PRODUCT_LABEL} in spec.placement.gpuProducts [{products}]",
        )
    pvc = spec.model.pvc
    if pvc is not None and cache.get("PersistentVolumeClaim", namespace, pvc.claim_name) is None:
        return Problem(
            "PVCNotFound",
            f"spec.model.pvc.claimName: PersistentVolumeClaim {pvc.claim_name!r} "
            f"does not exist in namespace {namespace!r}",
        )
    return None


def owned_by(obj: dict[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or [])


def owner_text(obj: dict[str, Any]) -> str:
    """Who holds an object, for a message: `DSV4Deployment other` or `nobody we know`."""
    refs = obj["metadata"].get("ownerReferences") or []
    held = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
    return f"{held['kind']} {held['name']}" if held else "no owner"


@dataclass
class RolloutPass:
    """The rollout's part of a pass: the status it started from, its decision, and the
    children it wants (stable and canary slices, with their records)."""

    before: RolloutStatus | None
    decision: Decision
    desired: list[dict[str, Any]]
    asked: str  # the engine revision the spec asks for
    events: list[tuple[str, str, str]] = field(default_factory=list)


class Reconciler:
    """One pass at a time per DSV4Deployment (`reconcile.controller` sees to it); reads go
    to ``cache``, writes to ``kube``, whose blocking client runs in a worker thread."""

    def __init__(
        self,
        kube: Kube,
        cache: Reader,
        rollout: RolloutController,
        host_memory: HostMemory = pod_memory,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        allowed: Allowed = SHIPPED,
    ) -> None:
        self.kube = kube
        self.cache = cache
        self.rollout = rollout
        self.host_memory = host_memory
        self.clock = clock
        self.allowed = allowed  # what the administrator allows a spec (`api.allowed`)
        self.expectations = Expectations()
        self.rendered = RenderMemory()
        self.specs = SpecMemory()
        self.events = EventRecorder(kube, clock)

    def forget(self, namespace: str, name: str, uid: str, name_reused: bool = False) -> None:
        """Drop what passes keep for a deployment that was deleted: its expected writes,
        its renders and its parsed spec (one place, so a memory added later is dropped too).
        ``name_reused``: a deployment of the same name exists again, whose expected writes
        (kept by name) stay."""
        if not name_reused:
            self.expectations.forget((namespace, name))
        self.rendered.forget(uid)
        self.specs.forget(uid)

    def remembered(self) -> dict[str, int]:
        """How many deployments each of those memories holds (`forget` empties them of a
        deleted one; the scale bench checks they come back to 0)."""
        return {
            "expectations": len(self.expectations),
            "renders": len(self.rendered),
            "specs": len(self.specs),
        }

    def reconcile_now(self, namespace: str, name: str) -> float | None:
        """One pass (redone on a status conflict); returns in how many seconds a deadline it
        waits for passes (None: none)."""
        for attempt in range(STATUS_ATTEMPTS):
            try:
                return self._pass(namespace, name, fresh=attempt > 0)
            except StatusConflict:
                log.info("%s/%s changed during the pass; deciding again", namespace, name)
        raise ApiError(409, f"{namespace}/{name} changed under {STATUS_ATTEMPTS} passes in a row")

    # -- one pass -----------------------------------------------------------------------
    def _pass(self, namespace: str, name: str, fresh: bool = False) -> float | None:
        """``fresh``: read the resource from the API server, not the cache (after a status
        conflict the cache is known to be behind)."""
        if fresh:
            obj = self.kube.get(KIND, namespace, name)
        else:
            obj = self.cache.get(KIND, namespace, name)
        if obj is None or obj["metadata"].get("deletionTimestamp"):
            return None
        owner = Owner(name=name, namespace=namespace, uid=obj["metadata"]["uid"])
        previous = parse_status(obj.get("status"))
        try:
            parsed = self.specs.parse(owner.uid, obj.get("spec") or {})
        except ValidationError as err:
            return self._finish(obj, owner, previous, Problem("InvalidSpec", first_error(err)))
        spec = parsed.spec
        bad_name = name_problem(name, spec.multinode)
        if bad_name is not None:
            return self._finish(obj, owner, previous, Problem("InvalidName", bad_name))
        stable, canary, unserved = self._children(owner)
        pods, events = self._why_not_ready(owner, [*stable, *canary])
        now = self.clock()
        ledger = Ledger.of(self.cache.get("ConfigMap", namespace, ledger_name(owner)))
        state = PassState(owner, obj, spec, previous, stable, canary, now, pods, events, ledger)
        problem = check_prerequisites(self.cache, namespace, spec, self.allowed, unserved)
        rollout: RolloutPass | None = None
        actions: list[Action] = []
        if problem is None:
            try:
                rollout = self._rollout(state, parsed)
            except Unrecoverable as err:
                problem = Problem("RolloutStateLost", str(err))
            except RevisionRejected as err:
                problem = Problem("RevisionRejected", str(err))
            except MemorySizingError as err:
                problem = Problem("InvalidSpec", str(err))
        if rollout is not None:
            actions, conflict = self._plan(state, rollout.desired)
            problem = conflict or _watch_problem(rollout.decision.status)
            unremembered = self._remember(state, rollout.decision)
            if unremembered is not None:  # nothing of the decision is written
                problem, rollout, actions = unremembered, None, []
        return self._finish(obj, owner, previous, problem, state, rollout, actions)

    def _finish(
        self,
        obj: dict[str, Any],
        owner: Owner,
        previous: DSV4DeploymentStatus | None,
        problem: Problem | None,
        state: PassState | None = None,
        rollout: RolloutPass | None = None,
        actions: list[Action] | None = None,
    ) -> float | None:
        """Status first (the decision recorded), then the writes it decided, then Events;
        returns in how many seconds a deadline the pass waits for passes."""
        actions = actions or []
        status = self._status(obj, previous, problem, state, rollout, actions)
        exceeded = any(
            c.type is ConditionType.DEGRADED and c.status == "True" and c.reason == DEADLINE
            for c in status.conditions
        )
        metrics.record_progress_deadline(owner.namespace, owner.name, exceeded)
        written = self._write_status(obj, owner, previous, status)
        if rollout is not None and rollout.decision.verdict is not None:
            metrics.record_decision(owner.namespace, owner.name, rollout.decision.verdict)
        failure = None
        done: list[Action] = []
        if state is not None:
            done, failure = self._write_children(owner, actions)
            if failure is None and rollout is not None:
                failure = self._carry_out(state, rollout)
        events = decision_events(done, previous, status)
        if rollout is not None:
            events += [*rollout.events, *rollout.decision.events]
        if previous is None:
            events = initialized(events)
        if failure is not None:
            events.append(("Warning", failure.reason, failure.message))
            degraded = self._status(obj, status, failure, state, rollout, [])
            self._write_status(written, owner, status, degraded)
        for event in events:
            self.events.record(obj, *event)
        return _recheck(state, status, rollout.decision.status if rollout else None)

    def _status(
        self,
        obj: dict[str, Any],
        previous: DSV4DeploymentStatus | None,
        problem: Problem | None,
        state: PassState | None,
        rollout: RolloutPass | None,
        actions: list[Action],
    ) -> DSV4DeploymentStatus:
        rollout_status = rollout.decision.status if rollout else None
        # What the children run is the rollout's stable flags, not (yet) the spec's.
        features = rollout_status.stable.features if rollout_status else None
        workloads = [o for o in (state.stable_live if state else []) if o["kind"] in WORKLOAD_KINDS]
        status = decide_status(
            generation=obj["metadata"].get("generation", 0),
            features=features,
            revision=rollout_status.stable_revision if rollout_status else None,
            roles=observe_roles(state.spec, workloads, state.owner) if state else {},
            problem=problem,
            applied=bool(actions),
            previous=previous,
            now=stamp(self.clock()),
            blockers=[b for b in state.blockers if not b.canary] if state else [],
            progress_deadline_seconds=state.spec.progress_deadline_seconds if state else None,
            pending=spec_pending(rollout_status, rollout.asked, state.ledger.rejected)
            if state and rollout
            else None,
        )
        if rollout_status is not None:
            dumped = rollout_status.model_dump(mode="json", by_alias=True, exclude_none=True)
            status = status.model_copy(update={"rollout": dumped})
        return status

    def _write_status(
        self,
        obj: dict[str, Any],
        owner: Owner,
        previous: DSV4DeploymentStatus | None,
        status: DSV4DeploymentStatus,
    ) -> dict[str, Any]:
        """The status written as a JSON patch of what changed since ``obj``
        (`kube.json_patch`), guarded by the resourceVersion the pass read (a patch that sets
        it is refused with a 409 once the object moved on); returns ``obj`` as the API
        server holds it after the write (``obj`` itself when nothing was written)."""
        if status == previous:
            return obj
        version = obj["metadata"].get("resourceVersion", "")
        held = status.model_dump(mode="json", by_alias=True, exclude_none=True)
        if "status" in obj:
            ops = json_patch(obj["status"], held, "/status")
        else:
            ops = [{"op": "add", "path": "/status", "value": held}]
        if not ops:
            return obj
        key = (owner.namespace, owner.name)
        self.expectations.status_written(key, status)
        guard = {"op": "replace", "path": "/metadata/resourceVersion", "value": version}
        try:
            written = self.kube.patch_status(KIND, owner.namespace, owner.name, [guard, *ops])
        except ApiError as err:
            # A patch of paths the object no longer has (its status edited meanwhile) is
            # refused before the resourceVersion is compared: a 422, a conflict all the same.
            if err.status == 409 or (err.status == 422 and self._moved(owner, version)):
                raise StatusConflict(str(err)) from None
            raise
        after = str((written or {}).get("metadata", {}).get("resourceVersion", version))
        if after != version:
            self.expectations.wrote(key, Write(KIND, owner.namespace, owner.name, version))
        return {**obj, "metadata": {**obj["metadata"], "resourceVersion": after}, "status": held}

    def _moved(self, owner: Owner, version: str) -> bool:
        current = self.kube.get(KIND, owner.namespace, owner.name)
        return current is None or current["metadata"].get("resourceVersion") != version

    # -- reading ------------------------------------------------------------------------
    def _children(
        self, owner: Owner
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], frozenset[str]]:
        """(stable, canary) children, in one list request per kind for both slices, and the
        kinds the API server does not serve (LeaderWorkerSet where LWS is not installed:
        only a multi-node spec needs it).  Labels find the children; the owner's UID
        decides whose they are: an object with this deployment's labels but another owner
        (a deleted namespace-mate's leftovers, a same-named predecessor still being
        garbage-collected) is not a child; its name is held (`_held`)."""
        canary = canary_owner(owner)
        found: dict[str, list[dict[str, Any]]] = {owner.name: [], canary.name: []}
        unserved = frozenset(k for k in CHILD_KINDS if not self.cache.served(k))
        selector = instance_selector(owner, canary)
        for kind in CHILD_KINDS:
            for item in self.cache.list(kind, owner.namespace, selector):
                if owned_by(item, owner.uid):
                    found[item["metadata"]["labels"][LABEL_INSTANCE]].append(item)
        return found[owner.name], found[canary.name], unserved

    def _why_not_ready(
        self, owner: Owner, children: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(pods, FailedCreate Events) of both slices, read only while one of their
        workloads is not settled: a steady-state pass reads neither."""
        workloads = [o for o in children if o["kind"] in WORKLOAD_KINDS]
        if all(settled(w) for w in workloads):
            return [], []
        pods = self.cache.list("Pod", owner.namespace, pod_selector(owner, canary_owner(owner)))
        events = self.cache.list("Event", owner.namespace, field_selector=FAILED_CREATE_SELECTOR)
        return pods, events

    def _before(self, state: PassState) -> tuple[RolloutStatus | None, list[tuple[str, str, str]]]:
        """The rollout status the pass starts from: read, or rebuilt from the children when
        lost (never taken from the spec; `recover`)."""
        before = parse_rollout(state.previous, state.spec)
        if before is not None:
            return before, []
        listed = self.cache.list("ConfigMap", state.owner.namespace, report_selector(state.owner))
        # A PASS is re-checked with the host-tier reads its revision asks for (a revision
        # no workload records is asked for them: nothing here says it runs without HiCache).
        revisions = recorded_revisions([*state.stable_live, *state.canary_live])

        def hicache(revision: str) -> bool:
            return revision not in revisions or probes_hicache(revisions[revision])

        completed = partial(self.rollout.executor.completed, state.owner)
        trust = Trust(state.owner, state.spec.canary, hicache, completed)
        reports = [FiledReport.of(cm, trust) for cm in listed]
        recovered = recover(state.stable_live, state.canary_live, reports, state.ledger, state.now)
        if recovered is None:
            return None, []
        message = f"status.rollout was missing or unreadable; rebuilt from the children: {recovered.summary}"
        return recovered.status, [("Warning", "RolloutStateRebuilt", message)]

    # -- deciding -----------------------------------------------------------------------
    def _rollout(self, state: PassState, parsed: ParsedSpec) -> RolloutPass:
        before, events = self._before(state)
        desired = parsed.asked
        renders = Desired(state.owner, state.spec, self.host_memory)
        if before is None:
            decision = first_status(desired, state.now, self._retry_of_rejected(state, desired))
            children = self.rendered.children(renders, decision.status)
            return RolloutPass(None, decision, children, desired.revision, events)
        current = self.rendered.children(renders, before)
        canary = renders.canary(before)
        observed = self.rollout.observe(
            state,
            before,
            canary,
            rolled=rolled_roles(self.rendered.active(renders, before), state.stable_live),
            settled_slots=settled_slots(current, state.stable_live),
            routers_live=frozenset(
                slot
                for slot in Slot
                if any(
                    o["metadata"]["name"] == router_name(state.owner, slot)
                    for o in state.stable_live
                    if o["kind"] == "Deployment"
                )
            ),  # fmt: skip
            canary_blocked=_canary_blocked(self._held(state.owner, canary)) or _uncreatable(state),
            canary_unplaced=_unplaced_text(state),
            gpu_nodes=len(self.cache.store("Node")),
            rejected={rev: r.text() for rev, r in state.ledger.rejected.items()},
        )
        decision = decide(
            desired,
            before,
            observed,
            state.spec.canary,
            state.spec.rollout,
            renders.pairs,
            offset=phase(state.owner.uid),
        )
        children = self.rendered.children(renders, decision.status)
        return RolloutPass(before, decision, children, desired.revision, events)

    def _retry_of_rejected(self, state: PassState, desired: EngineRevision) -> Manual | None:
        """Nothing serves yet and the spec asks for a rejected revision: it is never adopted
        as stable, unless a person's retry control names it (returned, to act on)."""
        rejection = state.ledger.rejected.get(desired.revision)
        if rejection is None:
            return None
        control = manual.parse(state.obj["metadata"].get("annotations"))
        if (
            control is not None
            and control.action is ManualAction.RETRY
            and control.revision == desired.revision
        ):
            return control
        raise RevisionRejected(
            f"the spec asks for engine revision {desired.revision}, rejected under this name "
            f"before ({rejection.text()}; ConfigMap {ledger_name(state.owner)}): it is not "
            "run until the spec changes or `dsv4ctl rollout retry` is run"
        )

    def _plan(
        self, state: PassState, desired: list[dict[str, Any]]
    ) -> tuple[list[Action], Problem | None]:
        """What to write: one plan over both slices, or nothing at all while any name it
        needs is held by another owner.  Written in part, the plan could start pods without
        what they must run with: a router under a ServiceAccount someone else made, with
        its token (the account's name taken, the Deployment written), or engines without
        their NetworkPolicy.  Once the name is free, the next pass writes it all."""
        held = self._held(state.owner, desired)
        if held:
            return [], Problem(
                "NameConflict",
                "nothing is written while names this deployment needs are held by another "
                f"owner: {', '.join(held)}; delete or rename them",
            )
        return plan(desired, [*state.stable_live, *state.canary_live]), None

    def _held(self, owner: Owner, objects: list[dict[str, Any]]) -> list[str]:
        """`Kind name (held by …)` for each of ``objects`` whose name is held by another
        owner, from the caches (the operator's own objects, and everyone else's names)."""
        held = []
        for obj in objects:
            kind, name = obj["kind"], obj["metadata"]["name"]
            holder = self.cache.holder(kind, owner.namespace, name)
            if holder is not None and not owned_by(holder, owner.uid):
                held.append(f"{kind} {name} (held by {owner_text(holder)})")
        return held

    # -- writing ------------------------------------------------------------------------
    def _remember(self, state: PassState, decision: Decision) -> Problem | None:
        """The decision's rejection into the ledger, before anything else of the pass is
        written: a status lost after any later write still finds the rejection there (an
        aborted or timed-out promotion is never resumed).  A refused ledger write is the
        pass's problem and nothing of its decision is written."""
        ledger = remembered(state.ledger, decision)
        if ledger == state.ledger:
            return None
        try:
            self.kube.apply(ledger_config_map(state.owner, ledger))
        except ApiError as err:
            return Problem(_reason(err), f"recording the rejection failed: {err}")
        return None

    def _write_children(
        self, owner: Owner, actions: list[Action]
    ) -> tuple[list[Action], Problem | None]:
        """Every child write of the pass: the writes done, and the first failure, which
        stops the rest (the status and an Event then name the object and why; the pass's
        `Applied` Event names only what was written)."""
        key = (owner.namespace, owner.name)
        done: list[Action] = []
        for action in actions:
            try:
                self._act(owner, action)
            except ApiError as err:
                return done, _write_failure(action, err)
            gone = action.verb == "delete"
            written = Write(action.kind, owner.namespace, action.name, action.version, gone)
            self.expectations.wrote(key, written)
            done.append(action)
        return done, None

    def _act(self, owner: Owner, action: Action) -> None:
        namespace = owner.namespace
        log.info(
            "%s %s/%s (%s)",
            action.verb,
            action.kind,
            action.name,
            action.reason,
            extra={"namespace": namespace, "verb": action.verb, "reason": action.reason},
        )
        if action.verb == "delete":
            # A router goes in the foreground: its Deployment stays listed until its pods
            # are gone, which is what a paired promotion waits for before the engines go.
            foreground = "Foreground" if action.kind == "Deployment" else None
            self.kube.delete(action.kind, namespace, action.name, propagation=foreground)
            return
        assert action.obj is not None
        if action.reason == "missing":
            # Whoever holds the name, from the caches: a name another owner holds is never
            # taken (the watch of everyone else's names is what makes this a memory read).
            # One of this deployment's own (its labels lost, say) is simply applied again.
            existing = self.cache.holder(action.kind, namespace, action.name)
            if existing is not None and not owned_by(existing, owner.uid):  # leave it be
                raise ApiError(
                    409, f"{action.kind} {action.name} exists and belongs to {owner_text(existing)}"
                )
        self.kube.apply(action.obj)

    def _carry_out(self, state: PassState, rollout: RolloutPass) -> Problem | None:
        try:
            self.rollout.carry_out(state, rollout.before, rollout.decision)
        except ApiError as err:
            return Problem(_reason(err), f"rollout step failed: {err}")
        status = rollout.decision.status
        since = parse_stamp(status.phase_since).timestamp() if status.phase_since else 0.0
        budget = state.spec.canary.max_corruption_rate
        metrics.record_phase(state.owner.namespace, state.owner.name, status.phase, since, budget)
        watch = status.stable_probe.verdict if status.stable_probe else None
        metrics.record_watch(state.owner.namespace, state.owner.name, watch)
        return None


def remembered(ledger: Ledger, decision: Decision) -> Ledger:
    """The ledger after ``decision``: its rejection added (again, after a crash between the
    status write and this one), a retried revision taken out."""
    status = decision.status
    if decision.retried is not None:
        ledger = ledger.without(decision.retried)
    if status.rejected_revision is not None:
        verdict = status.verdict.value if status.verdict else "rejected"
        at = status.phase_since or ""
        ledger = ledger.with_rejection(
            status.rejected_revision, Rejection(verdict, status.report, at)
        )
    return ledger


def _canary_blocked(held: list[str]) -> str | None:
    """Why the canary slice cannot be created: names it needs are held by another owner."""
    return f"the canary's names are held by another owner: {', '.join(held)}" if held else None


def _uncreated(state: PassState) -> list[Blocker]:
    """Canary pods their controller cannot create (a quota, an admission refusal)."""
    return [b for b in state.blockers if b.canary and b.reason == FAILED_CREATE]


def _uncreatable(state: PassState) -> str | None:
    """Why the canary cannot come up, once its controller has said so for the placement
    timeout (spec.canary.placementTimeoutSeconds): the rollout then ends at once (and
    INCONCLUSIVE), with Kubernetes' words."""
    grace = dt.timedelta(seconds=state.spec.canary.placement_timeout_seconds)
    for blocker in _uncreated(state):
        # Undated (never seen from Kubernetes' own writers): left to readyTimeoutSeconds.
        if blocker.since is not None and state.now - blocker.since >= grace:
            return f"the canary cannot be created: {blocker.text}"
    return None


def _unplaced_text(state: PassState) -> str | None:
    """The scheduler's words for a canary pod it cannot place: capacity, which the rollout
    waits for (phase CanaryPending) and never judges the flags by."""
    unplaced = [b for b in state.blockers if b.canary and b.reason == UNSCHEDULABLE]
    return f"the canary cannot be placed: {blockers_text(unplaced)}" if unplaced else None


def _recheck(
    state: PassState | None, status: DSV4DeploymentStatus, rollout: RolloutStatus | None
) -> float | None:
    """Seconds until the next deadline this pass waits for: the progress deadline of a
    Progressing deployment, the placement timeout of a canary pod that cannot be placed or
    created, the retry of a canary that found no capacity."""
    if state is None:
        return None
    waits = []
    left = deadline_left(status, state.spec.progress_deadline_seconds, stamp(state.now))
    if left is not None:
        waits.append(left)
    grace = state.spec.canary.placement_timeout_seconds
    for blocker in _uncreated(state):
        left = grace - (state.now - blocker.since).total_seconds() if blocker.since else 0.0
        if left > 0:
            waits.append(left)  # the placement timeout is still running
    if rollout is not None and rollout.phase is RolloutPhase.CANARY_PENDING:
        # Waiting for room: the placement timeout, or a NoCapacity canary's retry.
        since, wait = rollout.phase_since, grace
        if rollout.verdict is RolloutVerdict.NO_CAPACITY:
            since, wait = rollout.retry_at, 0
        if since is not None:
            waits.append(max(wait - (state.now - parse_stamp(since)).total_seconds(), 0.0))
    return min(waits, default=None)


def _watch_problem(status: RolloutStatus) -> Problem | None:
    watch = status.stable_probe
    if watch is not None and watch.verdict is WatchVerdict.CORRUPT:
        return Problem(
            "StableCorruption",
            "the production watch found corruption in the stable deployment "
            f"({watch.message}); nothing was changed automatically (see "
            "docs/runbook-canary-failed.md)",
        )
    return None


_REASONS = {403: "Forbidden", 404: "NotFound", 409: "Conflict", 422: "Invalid"}


def _reason(err: ApiError) -> str:
    return f"Write{_REASONS.get(err.status, 'Failed')}"


def _write_failure(action: Action, err: ApiError) -> Problem:
    return Problem(_reason(err), f"{action.verb} {action.kind} {action.name}: {err}")


def decision_events(
    actions: list[Action],
    previous: DSV4DeploymentStatus | None,
    status: DSV4DeploymentStatus,
) -> list[tuple[str, str, str]]:
    """(type, reason, message) of every decision this pass made; none when nothing changed.
    The children written are one Event for the pass, however many there were."""
    events = [written_event(actions)] if actions else []
    before = previous.phase if previous else None
    if status.phase != before:
        if status.phase is Phase.DEGRADED:
            degraded = _find_condition(status, ConditionType.DEGRADED)
            assert degraded is not None
            events.append(("Warning", degraded.reason, degraded.message))
        else:
            moved = f"phase {before} → {status.phase}" if before else f"phase {status.phase}"
            events.append(("Normal", f"Phase{status.phase}", moved))
    # Why replicas do not come up (a pod the scheduler cannot place, a pod that cannot be
    # created, a container that keeps failing): said once each time it changes.
    progressing = _find_condition(status, ConditionType.PROGRESSING)
    was = _find_condition(previous, ConditionType.PROGRESSING)
    if (
        progressing is not None
        and progressing.status == "True"
        and progressing.reason != ROLLING
        and (was is None or (was.reason, was.message) != (progressing.reason, progressing.message))
    ):
        events.append(("Warning", progressing.reason, progressing.message))
    return events


# What a deployment's first pass says, in this order, as one `Initialized` Event.
INITIALIZING = ("FlagsInitialized", "Applied", f"Phase{Phase.PROGRESSING}")


def initialized(events: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """A first pass's flags, created children and first phase as one Event (its other
    Events, a retry or a warning, stay their own): a deployment's creation is one thing
    that happened, and at 500 created together their 4 Events each were 2,000 of the
    operator's 9,350 writes (docs/dsv4deployment.md#scale)."""
    said = sorted(
        (e for e in events if e[1] in INITIALIZING), key=lambda e: INITIALIZING.index(e[1])
    )
    if len(said) < 2:
        return events
    rest = [e for e in events if e[1] not in INITIALIZING]
    return [("Normal", "Initialized", "; ".join(message for _, _, message in said)), *rest]


def written_event(actions: list[Action]) -> tuple[str, str, str]:
    """One Event for every child a pass wrote: `Applied` (or `Deleted`, when it only
    deleted), naming each object and why, grouped by why."""
    by_reason: dict[str, list[str]] = {}
    for a in actions:
        verb = "applied" if a.verb == "apply" else "deleted"
        by_reason.setdefault(f"{verb} ({a.reason})", []).append(f"{a.kind} {a.name}")
    message = "; ".join(f"{why}: {', '.join(names)}" for why, names in by_reason.items())
    only_deleted = all(a.verb == "delete" for a in actions)
    return "Normal", "Deleted" if only_deleted else "Applied", message


def _find_condition(status: DSV4DeploymentStatus | None, ctype: ConditionType) -> Condition | None:
    return next((c for c in status.conditions if c.type is ctype), None) if status else None
