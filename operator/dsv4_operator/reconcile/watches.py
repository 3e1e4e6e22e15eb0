"""What the operator watches, so that a pass reads only memory (`kube.cache`).

One informer per entry (per watched namespace): the DSV4Deployments themselves come
through kopf's watch (`reconcile.handlers`) into the same cache.  Selectors keep each watch
to the operator's own objects where labels allow; transforms drop what no pass reads, which
is most of a pod and every object's managedFields (who filed a report's verdict is checked
at admission, never read from its field managers: `rollout.reports.distrust_pass`).  A
second, metadata-only watch of each child kind keeps the names everyone else holds
(`cache.foreign`), so that creating a child needs no look-up first: a name another owner
holds is refused from memory, and a report someone else put at an attempt's name is seen.
The RBAC test derives the operator's list/watch permissions from this table.
"""

from __future__ import annotations

from dsv4_operator.api import KIND
from dsv4_operator.kube.cache import Obj, Store, foreign
from dsv4_operator.kube.informer import Watch
from dsv4_operator.reconcile.blockers import FAILED_CREATE_SELECTOR
from dsv4_operator.render.lws import LWS_KIND
from dsv4_operator.render.meta import APP, LABEL_INSTANCE, LABEL_NAME
from dsv4_operator.render.placement import GPU_PRODUCT_LABEL

OURS = f"{LABEL_NAME}={APP}"  # every child, report, probe Job and pod the operator makes
OTHERS = f"{LABEL_NAME}!={APP}"  # everything else (an object without the label too)
CHILD_KINDS = (
    "ConfigMap",
    "StatefulSet",
    LWS_KIND,  # served only where LWS is installed: only a multi-node spec needs it
    "Service",
    "PodDisruptionBudget",
    "ServiceAccount",
    "RoleBinding",
    "Deployment",
    "NetworkPolicy",
)


def without_managed_fields(obj: Obj) -> Obj:
    meta = obj["metadata"]
    if "managedFields" not in meta:
        return obj
    return {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


def name_only(obj: Obj) -> Obj:
    """Who holds a name: all a pass needs of another owner's object."""
    meta = obj["metadata"]
    kept = {k: meta[k] for k in ("name", "namespace", "uid", "ownerReferences") if k in meta}
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": kept}


def pod(obj: Obj) -> Obj:
    """A pod's metadata and status: why it is not coming up (`reconcile.blockers`)."""
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "metadata": without_managed_fields(obj)["metadata"],
        "status": obj.get("status") or {},
    }


WATCHES: tuple[Watch, ...] = (
    *(
        Watch(
            kind,
            OURS,
            indexed_labels=(LABEL_INSTANCE,),
            transform=without_managed_fields,
            optional=kind == LWS_KIND,
            why="the children of every deployment (and its rollout reports)",
        )
        for kind in CHILD_KINDS
    ),
    *(
        Watch(
            kind,
            OTHERS,
            metadata_only=True,
            transform=name_only,
            optional=kind == LWS_KIND,
            store=foreign(kind),
            why="the names other owners hold: a child is never created over one",
        )
        for kind in CHILD_KINDS
    ),
    Watch(
        "Job",
        OURS,
        indexed_labels=(LABEL_INSTANCE,),
        transform=without_managed_fields,
        why="probe Jobs: is an attempt still running, did it end cleanly",
    ),
    Watch(
        "Pod",
        f"{OURS},{LABEL_INSTANCE}",
        indexed_labels=(LABEL_INSTANCE,),
        transform=pod,
        why="why an engine or router pod does not come up",
    ),
    Watch(
        "Event",
        field_selector=FAILED_CREATE_SELECTOR,
        transform=without_managed_fields,
        why="why a controller could not create a pod",
    ),
    Watch(
        "Node",
        GPU_PRODUCT_LABEL,
        metadata_only=True,
        indexed_labels=(GPU_PRODUCT_LABEL,),
        why="is there a node with an allowed GPU product",
    ),
    Watch(
        "PersistentVolumeClaim",
        metadata_only=True,
        why="does the model's PVC exist",
    ),
)


def stores() -> list[Store]:
    """One store per watched kind, and the DSV4Deployments' (fed by kopf)."""
    return [Store(KIND), *(Store(w.stored_as, w.indexed_labels) for w in WATCHES)]
