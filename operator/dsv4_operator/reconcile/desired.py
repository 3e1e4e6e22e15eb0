"""Every child a rollout status wants, as the operator applies it: the stable slots, what
they share, and the canary slice, each workload carrying its rollout record.

Pure: the reconciler computes its children here each pass (`RenderMemory` keeps them for
the next pass that wants the same), and `dsv4ctl render` prints them from here without a
cluster, so what a reviewer reads is what the operator writes.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import orjson

from dsv4_engine.features import Role
from dsv4_operator.api.rollout import RolloutStatus
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.reconcile.plan import with_applied_hash
from dsv4_operator.render import render_slot, shared
from dsv4_operator.render.meta import WORKLOAD_KINDS, Owner
from dsv4_operator.render.workloads import HostMemory
from dsv4_operator.rollout.decide import canary_wanted
from dsv4_operator.rollout.pairs import Pairs, SlotPlan, plan_slots
from dsv4_operator.rollout.record import with_record
from dsv4_operator.rollout.slices import canary_objects, pinned, role_specs, with_revision


class Desired:
    """What one pass renders, each thing once: a pass renders the slots its status had
    (to observe them) and the ones its decision wants (to write them), mostly the same."""

    def __init__(self, owner: Owner, spec: DSV4DeploymentSpec, host_memory: HostMemory) -> None:
        self.owner, self.spec, self.host_memory = owner, spec, host_memory
        self.pairs = Pairs(spec.prefill.replicas, spec.decode.replicas)
        self._made: dict[tuple[object, ...], list[dict[str, Any]]] = {}

    @functools.cached_property
    def spec_json(self) -> str:
        """The spec as JSON, once a pass: what `RenderMemory` tells passes' renders apart by."""
        return self.spec.model_dump_json()

    def slot(self, plan: SlotPlan) -> list[dict[str, Any]]:
        flags = tuple((plan.flags[role].revision, plan.flags[role].image_digest) for role in Role)
        key = ("slot", plan.slot, flags, plan.replicas, plan.router)
        if key not in self._made:
            spec = self.spec
            sized = spec.model_copy(
                update={
                    "prefill": spec.prefill.model_copy(update={"replicas": plan.prefill}),
                    "decode": spec.decode.model_copy(update={"replicas": plan.decode}),
                }
            )
            by_role = role_specs(sized, plan.flags)
            base = with_revision(sized, plan.flags[Role.DECODE])
            rendered = render_slot(
                self.owner, base, plan.slot, self.host_memory, by_role, plan.router
            )
            self._made[key] = pinned(rendered, plan.flags)
        return self._made[key]

    def stable_configs(self, plan: SlotPlan, status: RolloutStatus) -> list[dict[str, Any]]:
        """The stable revision's `engine.yaml` of each role ``plan`` moves off it: kept while
        the role rolls, so an old pod that restarts meanwhile still finds its own."""
        moved = [role for role in Role if plan.flags[role] != status.stable]
        if not moved:
            return []
        stable = SlotPlan(plan.slot, dict.fromkeys(Role, status.stable), *plan.replicas, False)
        keys = {f"{role.value}.yaml" for role in moved}
        return [o for o in self.slot(stable) if o["kind"] == "ConfigMap" and keys & set(o["data"])]

    def active(self, status: RolloutStatus) -> list[dict[str, Any]]:
        """The active slot's engines as ``status`` has them (role-by-role promotion)."""
        return self.slot(plan_slots(status, self.pairs)[0])

    def canary(self, status: RolloutStatus) -> list[dict[str, Any]]:
        if not canary_wanted(status):
            return []
        key = ("canary", status.canary.revision if status.canary else None)
        if key not in self._made:
            self._made[key] = canary_objects(self.owner, self.spec, status, self.host_memory)
        return self._made[key]

    def children(self, status: RolloutStatus) -> list[dict[str, Any]]:
        """Every child ``status`` wants — the stable slots and the canary slice — each
        workload carrying the rollout record, in the order they are applied: what runs no
        pod (accounts, bindings, Services, NetworkPolicies, configs) before the workloads,
        so that pods start only once the identity and the NetworkPolicy they run with are
        written (a failed write stops the rest of the pass)."""
        objects = []
        for slot in plan_slots(status, self.pairs):
            objects += with_record(
                self.slot(slot), status.stable, slot.flags, status.rejected_revision
            )
            objects += self.stable_configs(slot, status)
        objects += shared(self.owner)
        if status.canary is not None:
            runs = dict.fromkeys(Role, status.canary)
            objects += with_record(self.canary(status), status.stable, runs, None)
        unique = {(o["kind"], o["metadata"]["name"]): o for o in objects}
        ordered = sorted(unique.values(), key=lambda o: o["kind"] in WORKLOAD_KINDS)
        return [with_applied_hash(o) for o in ordered]


class RenderMemory:
    """Each deployment's last renders, kept across passes.  `Desired` is pure: a pass whose
    owner, spec and rollout status are an earlier pass's wants the same objects, and most
    passes are such (a settled deployment's resync, a converging one's count updates).  A
    pass renders its status's children, its decision's, and its status's active slot (what
    has rolled): ~2.6 ms each, 6% of the operator's CPU in bench-scale after the children
    alone were kept.  Kept as JSON: every call returns objects of its own to change, and 500
    deployments' cost ~20 MB.  The ``kept`` last renders of a deployment are remembered (a
    rollout's pass renders two statuses, each both ways); `forget` drops a deleted one's."""

    def __init__(self, kept: int = 4) -> None:
        self.kept = kept
        self._lock = threading.Lock()  # passes of different deployments run in parallel
        self._by_uid: dict[str, OrderedDict[tuple[str, str, str], bytes]] = {}

    def children(self, desired: Desired, status: RolloutStatus) -> list[dict[str, Any]]:
        """`Desired.children`."""
        return self._kept("children", desired, status, desired.children)

    def active(self, desired: Desired, status: RolloutStatus) -> list[dict[str, Any]]:
        """`Desired.active`."""
        return self._kept("active", desired, status, desired.active)

    def _kept(
        self,
        what: str,
        desired: Desired,
        status: RolloutStatus,
        render: Callable[[RolloutStatus], list[dict[str, Any]]],
    ) -> list[dict[str, Any]]:
        # A uid names one object for good (its name and namespace never change).
        uid, key = desired.owner.uid, (what, desired.spec_json, status.model_dump_json())
        with self._lock:
            kept = self._by_uid.setdefault(uid, OrderedDict())
            rendered = kept.get(key)
            if rendered is not None:
                kept.move_to_end(key)
        if rendered is not None:
            return orjson.loads(rendered)
        objects = render(status)
        with self._lock:
            kept = self._by_uid.setdefault(uid, OrderedDict())
            kept[key] = orjson.dumps(objects)
            while len(kept) > self.kept:
                kept.popitem(last=False)
        return objects

    def forget(self, uid: str) -> None:
        with self._lock:
            self._by_uid.pop(uid, None)

    def __len__(self) -> int:
        return len(self._by_uid)
