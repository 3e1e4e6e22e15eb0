"""GPU placement: which nodes an engine pod may land on, and how replicas spread."""

from __future__ import annotations

from typing import Any

from dsv4_operator.api.spec import GPU_RESOURCE, PlacementSpec

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
HOSTNAME_KEY = "kubernetes.io/hostname"

GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}


def affinity(
    placement: PlacementSpec, role_selector: dict[str, str], group_key: str | None = None
) -> dict[str, Any]:
    """Allowed GPU products (required), at most one pod of a role per node (required), and
    with ``group_key`` (the label one multi-node replica's pods share) and
    `placement.topologyKey`: every pod of a replica in its group's topology domain.

    One pod per node also keeps the nodes of a multi-node replica on distinct hosts.  The
    group term is plain pod affinity, not LWS's exclusive topology: exclusive would give
    each group a whole NVLink domain (an NVL72 rack for a 4-tray prefill replica), while a
    rack can hold several replicas.  `matchLabelKeys` fills in the incoming pod's own group
    key, so one template serves every group; the first pod of a group may land in any
    domain (the scheduler lets a pod that matches its own term start one).
    """
    product_term = {
        "matchExpressions": [
            {"key": GPU_PRODUCT_LABEL, "operator": "In", "values": list(placement.gpu_products)}
        ]
    }
    terms: dict[str, Any] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [product_term]}
        },
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": role_selector}, "topologyKey": HOSTNAME_KEY}
            ]
        },
    }
    if group_key is not None and placement.topology_key is not None:
        same_group = {
            "labelSelector": {"matchLabels": role_selector},
            "matchLabelKeys": [group_key],
            "topologyKey": placement.topology_key,
        }
        terms["podAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [same_group]}
    return terms


def named_tolerations(placement: PlacementSpec) -> list[tuple[str, dict[str, Any]]]:
    """Every toleration an engine pod gets, with where it comes from (what the toleration
    allow-list, `api.allowed`, names in a refusal): the GPU taint's own, then the spec's."""
    spec = [
        (
            f"spec.placement.tolerations[{i}]",
            t.model_dump(mode="json", by_alias=True, exclude_none=True),
        )
        for i, t in enumerate(placement.tolerations)
    ]
    return [("the toleration of the GPU taint every engine pod gets", GPU_TOLERATION), *spec]


def tolerations(placement: PlacementSpec) -> list[dict[str, Any]]:
    return [toleration for _, toleration in named_tolerations(placement)]


def topology_spread(
    placement: PlacementSpec, role_selector: dict[str, str]
) -> list[dict[str, Any]]:
    """Spread a role's pods over NVLink domains when the user names the domain label (a
    preference: a multi-node replica's own pods are held in one domain by `affinity`)."""
    if placement.topology_key is None:
        return []
    return [
        {
            "maxSkew": 1,
            "topologyKey": placement.topology_key,
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": role_selector},
        }
    ]


def pod_placement(
    placement: PlacementSpec, role_selector: dict[str, str], group_key: str | None = None
) -> dict[str, Any]:
    """The placement part of a pod spec, empty fields left out."""
    fields: dict[str, Any] = {
        "affinity": affinity(placement, role_selector, group_key),
        "tolerations": tolerations(placement),
    }
    if placement.node_selector:
        fields["nodeSelector"] = dict(placement.node_selector)
    if placement.priority_class_name is not None:
        fields["priorityClassName"] = placement.priority_class_name
    spread = topology_spread(placement, role_selector)
    if spread:
        fields["topologySpreadConstraints"] = spread
    return fields
