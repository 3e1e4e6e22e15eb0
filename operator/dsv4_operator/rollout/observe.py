"""What the rollout state machine needs to know about the world, read from API objects.

Pure functions over live objects (the reconciler lists them once per pass).
"""

from __future__ import annotations

from typing import Any

from dsv4_engine.features import Role
from dsv4_operator.api.rollout import Slot
from dsv4_operator.render.lws import LWS_KIND
from dsv4_operator.render.meta import (
    ANNOTATION_APPLIED_HASH,
    ANNOTATION_CONFIG_HASH,
    ENGINE_KINDS,
    LABEL_COMPONENT,
    LABEL_SLOT,
    WORKLOAD_KINDS,
)


def _template_hash(workload: dict[str, Any]) -> str | None:
    """The engine config hash a workload's pods are made with (an LWS's leaders and workers
    carry the same one)."""
    spec = workload.get("spec", {})
    if workload["kind"] == LWS_KIND:
        spec = spec.get("leaderWorkerTemplate", {})
        template = spec.get("leaderTemplate") or spec.get("workerTemplate") or {}
    else:
        template = spec.get("template", {})
    return (template.get("metadata", {}).get("annotations") or {}).get(ANNOTATION_CONFIG_HASH)


def settled(workload: dict[str, Any]) -> bool:
    """Every replica is updated to the current template and ready (an LWS counts groups,
    and has no revisions in its status: its updated groups are the current template's)."""
    spec, status = workload.get("spec", {}), workload.get("status") or {}
    want = spec.get("replicas", 1)
    if status.get("observedGeneration", 0) < workload["metadata"].get("generation", 0):
        return False
    if workload["kind"] == "Deployment":
        return (
            status.get("updatedReplicas", 0) == want and status.get("availableReplicas", 0) >= want
        )
    return (
        status.get("updatedReplicas", 0) == want
        and status.get("readyReplicas", 0) == want
        and status.get("currentRevision") == status.get("updateRevision")
    )


def rolled_roles(desired: list[dict[str, Any]], live: list[dict[str, Any]]) -> frozenset[Role]:
    """Roles whose live engine workloads run the engine config rendered now, all replicas
    Ready."""
    live_sets = {o["metadata"]["name"]: o for o in live if o["kind"] in ENGINE_KINDS}
    done = set()
    for role in Role:
        wanted = [
            o
            for o in desired
            if o["kind"] in ENGINE_KINDS
            and o["metadata"]["labels"].get(LABEL_COMPONENT) == role.value
        ]
        if wanted and all(
            (current := live_sets.get(w["metadata"]["name"])) is not None
            and _template_hash(current) == _template_hash(w)
            and settled(current)
            for w in wanted
        ):
            done.add(role)
    return frozenset(done)


def slice_ready(desired: list[dict[str, Any]], live: list[dict[str, Any]]) -> bool:
    """Every workload of a slice exists with the rendered config and is settled."""
    live_by_name = {(o["kind"], o["metadata"]["name"]): o for o in live}
    workloads = [o for o in desired if o["kind"] in WORKLOAD_KINDS]
    for want in workloads:
        current = live_by_name.get((want["kind"], want["metadata"]["name"]))
        if current is None or not settled(current):
            return False
        if want["kind"] in ENGINE_KINDS and _template_hash(current) != _template_hash(want):
            return False
    return bool(workloads)


def settled_slots(desired: list[dict[str, Any]], live: list[dict[str, Any]]) -> frozenset[Slot]:
    """Slots whose every workload is live exactly as rendered (its applied hash) and
    settled: all replicas of the current template Ready — a paired promotion's step is done.
    A slot none of whose workloads is desired is not settled (it is not there)."""
    live_by_name = {(o["kind"], o["metadata"]["name"]): o for o in live}
    state: dict[Slot, bool] = {}
    for want in desired:
        slot = (want["metadata"].get("labels") or {}).get(LABEL_SLOT)
        if want["kind"] not in WORKLOAD_KINDS or slot is None:
            continue
        current = live_by_name.get((want["kind"], want["metadata"]["name"]))
        done = current is not None and _applied(current) == _applied(want) and settled(current)
        state[Slot(slot)] = state.get(Slot(slot), True) and done
    return frozenset(slot for slot, done in state.items() if done)


def _applied(obj: dict[str, Any]) -> str | None:
    return (obj["metadata"].get("annotations") or {}).get(ANNOTATION_APPLIED_HASH)
