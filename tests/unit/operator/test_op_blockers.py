"""Why a replica is not coming up, read from pods and FailedCreate Events as the kubelet,
the scheduler and the controllers write them (pure functions)."""

from __future__ import annotations

import datetime as dt

from dsv4_operator.reconcile.blockers import Blocker, blockers, blockers_text

T = "2026-11-30T12:00:00Z"
LABELS = {"app.kubernetes.io/name": "dsv4", "app.kubernetes.io/instance": "flash"}


def sts(name="flash-decode", component="decode", uid="sts-1", replicas=1, instance="flash"):
    labels = {**LABELS, "app.kubernetes.io/instance": instance}
    return {
        "kind": "StatefulSet",
        "metadata": {
            "name": name,
            "uid": uid,
            "labels": {**labels, "app.kubernetes.io/component": component},
        },
        "spec": {"replicas": replicas},
    }


def router():
    return {
        "kind": "Deployment",
        "metadata": {
            "name": "flash-router",
            "uid": "dep-1",
            "labels": {**LABELS, "app.kubernetes.io/component": "router"},
        },
        "spec": {"replicas": 1},
    }


def pod(name, owner_kind="StatefulSet", owner="flash-decode", uid="sts-1", **status):
    component = "router" if owner_kind == "ReplicaSet" else owner.rsplit("-", 1)[-1]
    return {
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {**LABELS, "app.kubernetes.io/component": component},
            "ownerReferences": [
                {"kind": owner_kind, "name": owner, "uid": uid, "controller": True}
            ],
        },
        "status": status,
    }


def waiting(reason, message="", last=None):
    status = {"name": "engine", "state": {"waiting": {"reason": reason, "message": message}}}
    if last:
        status["lastState"] = {"terminated": last}
    return {"containerStatuses": [status]}


def failed_create(kind, name, message, uid=None, first=T, last=T):
    return {
        "kind": "Event",
        "reason": "FailedCreate",
        "involvedObject": {"kind": kind, "name": name, "uid": uid},
        "message": message,
        "firstTimestamp": first,
        "lastTimestamp": last,
    }


def test_the_schedulers_reason_names_role_and_pod():
    unschedulable = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/6 nodes are available: 4 Insufficient memory.",
        "lastTransitionTime": T,
    }
    found = blockers([sts()], [pod("flash-decode-0", conditions=[unschedulable])], [])
    assert found == [
        Blocker(
            "decode",
            False,
            "pod flash-decode-0",
            "Unschedulable",
            "0/6 nodes are available: 4 Insufficient memory.",
            dt.datetime(2026, 11, 30, 12, tzinfo=dt.UTC),
        )
    ]
    assert found[0].text == (
        "decode pod flash-decode-0: Unschedulable: 0/6 nodes are available: 4 Insufficient memory."
    )


def test_waiting_containers_say_why_with_the_last_exit():
    crash = waiting(
        "CrashLoopBackOff",
        "back-off 40s restarting failed container=engine",
        last={"reason": "Error", "exitCode": 1},
    )
    pull = waiting("ImagePullBackOff", 'Back-off pulling image "ghcr.io/dsv4/engine:nope"')
    found = blockers(
        [sts(), sts("flash-prefill", "prefill", "sts-2")],
        [
            pod("flash-decode-0", **crash),
            pod("flash-prefill-0", owner="flash-prefill", uid="sts-2", **pull),
        ],
        [],
    )
    assert [b.text for b in found] == [
        "decode pod flash-decode-0 container engine: CrashLoopBackOff: back-off 40s restarting "
        "failed container=engine (last exit: Error, code 1)",
        "prefill pod flash-prefill-0 container engine: ImagePullBackOff: Back-off pulling image "
        '"ghcr.io/dsv4/engine:nope"',
    ]


def test_a_container_on_its_normal_way_up_is_no_reason():
    found = blockers([sts()], [pod("flash-decode-0", **waiting("ContainerCreating"))], [])
    assert found == []


def test_a_failed_create_counts_only_while_pods_are_missing_and_for_this_workload():
    event = failed_create("StatefulSet", "flash-decode", "exceeded quota", uid="sts-1")
    old_namesake = failed_create("StatefulSet", "flash-decode", "older", uid="sts-0")
    assert [b.text for b in blockers([sts()], [], [event, old_namesake])] == [
        "decode StatefulSet flash-decode: FailedCreate: exceeded quota"
    ]
    assert blockers([sts()], [pod("flash-decode-0")], [event]) == []  # the pod exists since


def test_a_router_failed_create_is_read_from_its_replica_set():
    event = failed_create("ReplicaSet", "flash-router-5d8f7c9b4", "forbidden: quota")
    other = failed_create("ReplicaSet", "flash-router-x-router-5d8f7c9b4", "not ours")
    found = blockers([router()], [], [event, other])
    assert [b.text for b in found] == [
        "router Deployment flash-router: FailedCreate: forbidden: quota"
    ]


def test_the_latest_failed_create_is_shown_and_the_first_dates_it():
    early = failed_create("StatefulSet", "flash-decode", "first", "sts-1", last=T)
    later = failed_create(
        "StatefulSet",
        "flash-decode",
        "second",
        "sts-1",
        "2026-11-30T12:00:05Z",
        "2026-11-30T12:00:09Z",
    )
    (found,) = blockers([sts()], [], [later, early])
    assert found.message == "second" and found.since == dt.datetime(2026, 11, 30, 12, tzinfo=dt.UTC)


def test_pods_of_another_workload_and_terminating_pods_are_not_ours():
    unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    foreign = pod("flash-decode-0", uid="sts-old", conditions=[unschedulable])
    leaving = pod("flash-decode-1", conditions=[unschedulable])
    leaving["metadata"]["deletionTimestamp"] = T
    assert blockers([sts()], [foreign, leaving], []) == []


def test_canary_pods_say_so_and_long_lists_are_cut():
    canary = sts("flash--canary-decode", instance="flash--canary", uid="c-1", replicas=5)
    pods = []
    for i in range(5):
        p = pod(f"flash--canary-decode-{i}", owner="flash--canary-decode", uid="c-1")
        p["metadata"]["labels"]["app.kubernetes.io/instance"] = "flash--canary"
        p["status"] = waiting("ErrImagePull")
        pods.append(p)
    found = blockers([canary], pods, [])
    assert all(b.canary for b in found) and found[0].text.startswith("canary decode pod")
    assert blockers_text(found).endswith("; and 2 more")
