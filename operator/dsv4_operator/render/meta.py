"""Names, labels and owner references shared by every rendered object."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dsv4_operator.api import API_VERSION, KIND
from dsv4_operator.api.rollout import Slot
from dsv4_operator.render.lws import LWS_KIND

MANAGED_BY = "dsv4-operator"
APP = "dsv4"  # the app.kubernetes.io/name of every child and every pod it runs
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_GROUP_ROLE = "inference.dsv4.dev/group-role"
LABEL_SLOT = "inference.dsv4.dev/slot"
LABEL_TRANSFER = "inference.dsv4.dev/transfer-revision"
# What a rollout files and runs next to the children (its probe reports, the probe Jobs and
# their identity): written by the operator like everything else, but not children — the
# children reconcile leaves them to the rollout (and the garbage collector).
PROBE_COMPONENT = "probe"
REPORT_COMPONENT = "rollout-report"
# The engine container of every engine pod (what a pod's status names).
ENGINE_CONTAINER = "engine"
ANNOTATION_CONFIG_HASH = "inference.dsv4.dev/engine-config-hash"
ANNOTATION_APPLIED_HASH = "inference.dsv4.dev/applied-hash"
# What runs a role's engines: a StatefulSet (one node per replica) or a LeaderWorkerSet
# (several; `render.workloads`).  With the router's Deployment: every workload of a slot.
ENGINE_KINDS = ("StatefulSet", LWS_KIND)
WORKLOAD_KINDS = (*ENGINE_KINDS, "Deployment")


def slot_selector(slot: Slot) -> dict[str, str]:
    """The slot label as a workload's (immutable) selector carries it: `blue`'s selectors
    predate slots and carry none; `green`'s do.  Both slots' pods are labelled."""
    return {} if slot is Slot.BLUE else {LABEL_SLOT: slot.value}


@dataclass(frozen=True)
class Owner:
    """The DSV4Deployment every child belongs to (garbage-collected with it)."""

    name: str
    namespace: str
    uid: str


def selector_labels(owner: Owner, component: str) -> dict[str, str]:
    return {LABEL_NAME: APP, LABEL_INSTANCE: owner.name, LABEL_COMPONENT: component}


def instance_selector(*owners: Owner) -> str:
    """Label selector of every child of these owners (one list request serves them all):
    what the operator manages for them, but a rollout's probe objects."""
    names = ",".join(owner.name for owner in owners)
    rollout = f"{PROBE_COMPONENT},{REPORT_COMPONENT}"
    return (
        f"{LABEL_INSTANCE} in ({names}),{LABEL_MANAGED_BY}={MANAGED_BY},"
        f"{LABEL_COMPONENT} notin ({rollout})"
    )


def pod_selector(*owners: Owner) -> str:
    """Label selector of the engine and router pods of these owners (pod templates carry the
    selector labels, not managed-by)."""
    names = ",".join(owner.name for owner in owners)
    return f"{LABEL_NAME}={APP},{LABEL_INSTANCE} in ({names})"


def metadata(owner: Owner, name: str, component: str) -> dict[str, Any]:
    """Every object the operator writes says so (`app.kubernetes.io/managed-by`): the
    install's admission policy lets the operator's account write nothing else."""
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": {**selector_labels(owner, component), LABEL_MANAGED_BY: MANAGED_BY},
        "ownerReferences": [
            {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": owner.name,
                "uid": owner.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
