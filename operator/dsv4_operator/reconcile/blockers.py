"""Why a workload is not Ready, in Kubernetes' own words (pure functions over listed objects).

A StatefulSet's status only counts pods; the reason a replica does not come up is elsewhere:
on the pod (the scheduler's `PodScheduled=False/Unschedulable` condition, a container's
`waiting` state such as CrashLoopBackOff or ImagePullBackOff), or — when there is no pod to
look at — in the `FailedCreate` Event the controller writes on its StatefulSet or
ReplicaSet (a name or label that cannot exist, a quota, an admission webhook).  The
reconciler reads Pods and those Events (one list each) only while some workload of the
deployment is not settled, so a steady-state pass reads neither.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from dsv4_engine.features import Role
from dsv4_operator.api.names import CANARY_SUFFIX
from dsv4_operator.api.times import parse_stamp
from dsv4_operator.render.lws import LWS_KIND, LWS_NAME_LABEL
from dsv4_operator.render.meta import LABEL_COMPONENT, LABEL_INSTANCE
from dsv4_operator.render.router import COMPONENT as ROUTER

# What `Kube.list("Event", ..., field_selector=...)` asks for: the controllers' reason for a
# pod they could not create.
FAILED_CREATE = "FailedCreate"
FAILED_CREATE_SELECTOR = f"reason={FAILED_CREATE}"
UNSCHEDULABLE = "Unschedulable"
# A container on its normal way up: not a reason to report.
STARTING = frozenset({"ContainerCreating", "PodInitializing"})
COMPONENTS = frozenset({*(r.value for r in Role), ROUTER})
SHOWN = 3  # blockers spelled out in a condition message (the rest are counted)


@dataclass(frozen=True)
class Blocker:
    """One reason one replica of a role is not coming up."""

    component: str  # prefill | decode | router
    canary: bool  # in the canary slice
    subject: str  # "pod flash-decode-0", or "StatefulSet flash-decode" when no pod exists
    reason: str  # Kubernetes' reason: Unschedulable, FailedCreate, CrashLoopBackOff, ...
    message: str  # Kubernetes' words
    since: dt.datetime | None = None  # first reported (Unschedulable, FailedCreate)

    @property
    def text(self) -> str:
        where = f"canary {self.component}" if self.canary else self.component
        said = f": {self.message}" if self.message else ""
        return f"{where} {self.subject}: {self.reason}{said}"


def blockers_text(blockers: list[Blocker]) -> str:
    shown = "; ".join(b.text for b in blockers[:SHOWN])
    more = len(blockers) - SHOWN
    return shown + (f"; and {more} more" if more > 0 else "")


def _stamp(text: str | None) -> dt.datetime | None:
    try:
        return parse_stamp(text) if text else None
    except ValueError:
        return None


def _component(obj: dict[str, Any]) -> tuple[str, bool] | None:
    labels = obj["metadata"].get("labels") or {}
    component = labels.get(LABEL_COMPONENT)
    if component not in COMPONENTS:
        return None
    return component, str(labels.get(LABEL_INSTANCE, "")).endswith(CANARY_SUFFIX)


def _controller(obj: dict[str, Any]) -> dict[str, Any] | None:
    refs = obj["metadata"].get("ownerReferences") or []
    return next((r for r in refs if r.get("controller")), None)


def _made_by(pod: dict[str, Any], workload: dict[str, Any]) -> bool:
    """The pod belongs to the workload: a StatefulSet owns its pods directly, a Deployment
    through a ReplicaSet named `<deployment>-<hash>`, a LeaderWorkerSet through the
    StatefulSets it makes, whose pods carry its name."""
    meta = workload["metadata"]
    if workload["kind"] == LWS_KIND:
        return (pod["metadata"].get("labels") or {}).get(LWS_NAME_LABEL) == meta["name"]
    ref = _controller(pod)
    if ref is None:
        return False
    if workload["kind"] == "StatefulSet":
        return ref.get("uid") == meta.get("uid")
    return ref.get("kind") == "ReplicaSet" and _replica_set_of(ref.get("name", ""), meta["name"])


def _replica_set_of(replica_set: str, deployment: str) -> bool:
    prefix = f"{deployment}-"
    return replica_set.startswith(prefix) and "-" not in replica_set[len(prefix) :]


# (where in the pod, reason, message, first reported)
Reason = tuple[str, str, str, dt.datetime | None]


def _unscheduled(status: dict[str, Any]) -> list[Reason]:
    """The scheduler's word on a pod it could not place."""
    return [
        ("", UNSCHEDULABLE, c.get("message", ""), _stamp(c.get("lastTransitionTime")))
        for c in status.get("conditions") or []
        if (c.get("type"), c.get("status"), c.get("reason"))
        == ("PodScheduled", "False", UNSCHEDULABLE)
    ]


def _waiting(status: dict[str, Any]) -> list[Reason]:
    """The kubelet's word on containers that do not start, with how each last ended."""
    out = []
    for container in [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]:
        waiting = (container.get("state") or {}).get("waiting")
        if not waiting or waiting.get("reason") in STARTING:
            continue
        message = waiting.get("message", "")
        last = (container.get("lastState") or {}).get("terminated")
        if last:
            message += (
                f" (last exit: {last.get('reason', 'terminated')}, code {last.get('exitCode')})"
            )
        where = f" container {container.get('name')}"
        out.append((where, waiting.get("reason") or "Waiting", message.strip(), None))
    return out


def pod_blockers(pod: dict[str, Any]) -> list[Blocker]:
    """What the scheduler and the kubelet say holds one pod back."""
    found = _component(pod)
    if found is None or pod["metadata"].get("deletionTimestamp"):
        return []
    subject = f"pod {pod['metadata']['name']}"
    status = pod.get("status") or {}
    return [
        Blocker(*found, f"{subject}{where}", reason, message, since)
        for where, reason, message, since in [*_unscheduled(status), *_waiting(status)]
    ]


def create_failures(
    workloads: list[dict[str, Any]], pods: list[dict[str, Any]], events: list[dict[str, Any]]
) -> list[Blocker]:
    """The latest `FailedCreate` of each workload that has fewer pods than it wants (an old
    Event of a workload whose pods exist since is history, not a reason)."""
    out = []
    for workload in workloads:
        found = _component(workload)
        if found is None:
            continue
        meta = workload["metadata"]
        wanted = (workload.get("spec") or {}).get("replicas", 1)
        if sum(1 for p in pods if _made_by(p, workload)) >= wanted:
            continue
        mine = [e for e in events if e.get("reason") == FAILED_CREATE and _about(e, workload)]
        if not mine:
            continue
        latest = max(
            mine,
            key=lambda e: _event_time(e, "lastTimestamp") or dt.datetime.min.replace(tzinfo=dt.UTC),
        )
        first = min((t for e in mine if (t := _event_time(e, "firstTimestamp"))), default=None)
        out.append(
            Blocker(
                *found,
                f"{workload['kind']} {meta['name']}",
                FAILED_CREATE,
                latest.get("message", ""),
                first,
            )
        )
    return out


def _about(event: dict[str, Any], workload: dict[str, Any]) -> bool:
    involved = event.get("involvedObject") or {}
    meta = workload["metadata"]
    if workload["kind"] == LWS_KIND:
        # Its leaders' StatefulSet `<lws>` and each group's workers' `<lws>-<group>`.
        name = involved.get("name", "")
        group = name.removeprefix(f"{meta['name']}-")
        return involved.get("kind") == "StatefulSet" and (
            name == meta["name"] or (group != name and group.isdigit())
        )
    if workload["kind"] == "StatefulSet":
        return involved.get("kind") == "StatefulSet" and involved.get("uid") == meta.get("uid")
    return involved.get("kind") == "ReplicaSet" and _replica_set_of(
        involved.get("name", ""), meta["name"]
    )


def _event_time(event: dict[str, Any], field: str) -> dt.datetime | None:
    """An Event's first or last time (core/v1 Events written through events/v1 carry only
    `eventTime`, with microseconds)."""
    text = event.get(field) or event.get("eventTime")
    if not text:
        return None
    return _stamp(text) or _stamp(str(text).split(".")[0] + "Z")


def blockers(
    workloads: list[dict[str, Any]], pods: list[dict[str, Any]], events: list[dict[str, Any]]
) -> list[Blocker]:
    """Every reason a replica of these workloads is not coming up, in a stable order."""
    ours = [p for p in pods if any(_made_by(p, w) for w in workloads)]
    found = [b for p in ours for b in pod_blockers(p)] + create_failures(workloads, ours, events)
    return sorted(found, key=lambda b: (b.canary, b.component, b.subject, b.reason))
