"""GPU placement: which nodes an engine pod may land on, and how replicas spread."""

from __future__ import annotations

from typing import Any

from dsv4_operator.api.spec import PlacementSpec

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"
HOSTNAME_KEY = "kubernetes.io/hostname"
GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}


def affinity(placement: PlacementSpec, role_selector: dict[str, str]) -> dict[str, Any]:
    """Allowed GPU products (required), and at most one pod of a role per node (required).

    One pod per node also keeps the nodes of a multi-node replica on distinct hosts.
    """
    product_term = {
        "matchExpressions": [
            {"key": GPU_PRODUCT_LABEL, "operator": "In", "values": list(placement.gpu_products)}
        ]
    }
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [product_term]}
        },
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": role_selector}, "topologyKey": HOSTNAME_KEY}
            ]
        },
    }


def tolerations(placement: PlacementSpec) -> list[dict[str, Any]]:
    extra = [
        t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in placement.tolerations
    ]
    return [GPU_TOLERATION, *extra]


def topology_spread(
    placement: PlacementSpec, role_selector: dict[str, str]
) -> list[dict[str, Any]]:
    """Spread a role's pods over NVLink domains when the user names the domain label."""
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


def pod_placement(placement: PlacementSpec, role_selector: dict[str, str]) -> dict[str, Any]:
    """The placement part of a pod spec, empty fields left out."""
    fields: dict[str, Any] = {
        "affinity": affinity(placement, role_selector),
        "tolerations": tolerations(placement),
    }
    if placement.node_selector:
        fields["nodeSelector"] = dict(placement.node_selector)
    spread = topology_spread(placement, role_selector)
    if spread:
        fields["topologySpreadConstraints"] = spread
    return fields
