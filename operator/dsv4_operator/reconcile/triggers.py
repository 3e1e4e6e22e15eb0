"""Which watched changes call for a pass, and whose (pure functions over old and new).

A pass is level-triggered: it reads everything again, so a change only needs to say *that*
a deployment should look again, never what changed.  What does not need a pass is
filtered out here, because passes are the operator's cost: most watch events are the
cluster's controllers reporting progress no decision depends on, or echoes of the
operator's own writes.  The rules (the predicates of a controller-runtime controller):

- the DSV4Deployment: new, its spec (generation), labels, annotations or deletion changed,
  or its status changed and is not the one this process wrote (its own status write does
  not trigger a pass);
- a child: created by someone else (no applied hash), deleted, edited by someone else (what
  the operator renders changed while its applied hash did not: drift), or — workloads —
  what a pass makes of their progress changed: the ready and updated replicas the status
  shows (`reconcile.status.workload_progress`) or whether the workload is settled
  (`rollout.observe.settled`).  A controller's status update that moves neither (it has
  seen the new spec but made no pod yet) is no news;
- a report ConfigMap: its verdict appeared or changed; a probe Job: it started or ended;
- a pod: why it is not coming up changed (`reconcile.blockers`): a pod becoming Ready shows
  in its workload's counts;
- a `FailedCreate` Event: added or changed, for the workload it is about.

Nodes and PVCs wake nothing: a deployment missing one is looked at again by its resync.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dsv4_operator.api import GROUP, KIND
from dsv4_operator.api.names import CANARY_SUFFIX
from dsv4_operator.kube.cache import Obj, Reader
from dsv4_operator.reconcile.blockers import pod_blockers
from dsv4_operator.reconcile.status import workload_progress
from dsv4_operator.render.meta import (
    ANNOTATION_APPLIED_HASH,
    APP,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_NAME,
    WORKLOAD_KINDS,
)
from dsv4_operator.rollout.observe import settled
from dsv4_operator.rollout.probe_job import COMPONENT as PROBE_COMPONENT
from dsv4_operator.rollout.probe_job import job_state
from dsv4_operator.rollout.reports import COMPONENT as REPORT_COMPONENT
from dsv4_operator.rollout.reports import outcome_from_config_map

WORKLOADS = WORKLOAD_KINDS
# Metadata that says nothing about what an object is (the API server's bookkeeping).
BOOKKEEPING = frozenset(
    {"resourceVersion", "managedFields", "generation", "annotations", "uid", "creationTimestamp"}
)


def owning_deployment(meta: dict[str, Any]) -> str | None:
    """The DSV4Deployment a child belongs to.  A probe Job names it through its report's
    labels instead (its owner is the report ConfigMap), a pod through its slice's instance
    label (its owner is a StatefulSet or ReplicaSet): `<name>` or `<name>--canary`."""
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == KIND and ref.get("apiVersion", "").startswith(f"{GROUP}/"):
            return str(ref["name"])
    labels = meta.get("labels") or {}
    if labels.get(LABEL_COMPONENT) == PROBE_COMPONENT:
        return labels.get(LABEL_INSTANCE)
    if labels.get(LABEL_NAME) == APP and labels.get(LABEL_INSTANCE):
        return str(labels[LABEL_INSTANCE]).removesuffix(CANARY_SUFFIX)
    return None


def _applied(obj: Obj) -> str | None:
    return (obj["metadata"].get("annotations") or {}).get(ANNOTATION_APPLIED_HASH)


def _content(obj: Obj) -> tuple[object, ...]:
    """What an object is, without status and the API server's bookkeeping."""
    meta = {k: v for k, v in obj["metadata"].items() if k not in BOOKKEEPING}
    return meta, {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def _progress(obj: Obj) -> tuple[object, ...]:
    """What a pass makes of a workload's progress (the same functions the pass calls)."""
    return workload_progress(obj), settled(obj)


def child_changed(old: Obj | None, new: Obj | None) -> bool:
    """A change of one of the operator's children that a pass must see."""
    if new is None:
        return True
    if old is None:
        return _applied(new) is None  # the operator's own creation carries its hash
    if new["kind"] in WORKLOADS and _progress(old) != _progress(new):
        return True
    # The operator's writes change the applied hash; the same hash with other content is
    # someone else's edit (drift, which the pass repairs).
    return _applied(old) == _applied(new) and _content(old) != _content(new)


def report_changed(old: Obj | None, new: Obj | None) -> bool:
    """A probe filed (or changed) its verdict, or the report went away."""
    if new is None:
        return True
    return (outcome_from_config_map(old) if old else None) != outcome_from_config_map(new)


def job_changed(old: Obj | None, new: Obj | None) -> bool:
    """A probe Job appeared, ended or went away."""
    return job_state(old)[0] != job_state(new)[0]


def pod_changed(old: Obj | None, new: Obj | None) -> bool:
    """Why a pod is not coming up changed (a pod appearing or going with no reason: no)."""
    return (pod_blockers(old) if old else []) != (pod_blockers(new) if new else [])


def event_changed(old: Obj | None, new: Obj | None) -> bool:
    """A controller recorded (again, or differently) that it could not create a pod."""
    if new is None:
        return False
    return old is None or (old.get("message"), old.get("count")) != (
        new.get("message"),
        new.get("count"),
    )


def _config_map_changed(old: Obj | None, new: Obj | None) -> bool:
    labels = ((new or old or {}).get("metadata") or {}).get("labels") or {}
    if labels.get(LABEL_COMPONENT) == REPORT_COMPONENT:
        return report_changed(old, new)
    return child_changed(old, new)


CHANGED: dict[str, Callable[[Obj | None, Obj | None], bool]] = {
    "ConfigMap": _config_map_changed,
    "Job": job_changed,
    "Pod": pod_changed,
    "Event": event_changed,
}


def woken(kind: str, old: Obj | None, new: Obj | None, cache: Reader) -> tuple[str, str] | None:
    """The (namespace, name) of the DSV4Deployment a watched change calls a pass for."""
    if kind in ("Node", "PersistentVolumeClaim"):
        return None
    if not CHANGED.get(kind, child_changed)(old, new):
        return None
    obj = new or old
    assert obj is not None
    meta = obj["metadata"]
    namespace = meta.get("namespace", "")
    owner = _event_owner(obj, cache) if kind == "Event" else owning_deployment(meta)
    return (namespace, owner) if owner else None


def _event_owner(event: Obj, cache: Reader) -> str | None:
    """The deployment whose workload an Event is about: a StatefulSet directly, a router
    Deployment through its ReplicaSet `<deployment>-<hash>`."""
    involved = event.get("involvedObject") or {}
    namespace = involved.get("namespace") or event["metadata"].get("namespace")
    name = involved.get("name", "")
    if involved.get("kind") == "StatefulSet":
        workload = cache.get("StatefulSet", namespace, name)
    elif involved.get("kind") == "ReplicaSet" and "-" in name:
        workload = cache.get("Deployment", namespace, name.rsplit("-", 1)[0])
    else:
        return None
    return owning_deployment(workload["metadata"]) if workload else None


def deployment_changed(old: Obj | None, new: Obj, own_status: Callable[[Obj], bool]) -> bool:
    """A change of the DSV4Deployment that needs a pass; ``own_status(obj)``: its status is
    the one this process wrote last."""
    if old is None:
        return True
    before, after = old["metadata"], new["metadata"]
    if any(
        before.get(f) != after.get(f)
        for f in ("generation", "labels", "annotations", "deletionTimestamp")
    ):
        return True
    return old.get("status") != new.get("status") and not own_status(new)
