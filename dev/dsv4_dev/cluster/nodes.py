"""Fake node manifests for the local cluster (pure data, no I/O).

KWOK manages every Node annotated ``kwok.x-k8s.io/node: fake``: it marks it Ready and runs
the pods bound to it through their lifecycle, so the scheduler places real pods on nodes
that look exactly like GPU nodes to it — labels, extended resources and taints included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The label and resource the operator places engine pods by: the fake nodes must carry them.
from dsv4_operator.render.placement import GPU_PRODUCT_LABEL, GPU_RESOURCE

GPU_COUNT_LABEL = "nvidia.com/gpu.count"
# GPU feature discovery's label for a node's NVLink domain on multi-node NVLink systems
# (GB200 NVL72: one rack), `<cluster UUID>.<clique id>`.
GPU_CLIQUE_LABEL = "nvidia.com/gpu.clique"
FAKE_CLUSTER_UUID = "00000000-0000-0000-0000-00000000d5f4"
# What RDMA roles request besides GPUs (the samples' `resources.rdma` and `hugepages1Gi`):
# one InfiniBand NIC per GPU, as on DGX B200 and GB200 trays (k8s-rdma-shared-dev-plugin's
# resource name), and pre-allocated 1 GiB huge pages.
RDMA_RESOURCE = "rdma/ib"
GPU_NODE_HUGEPAGES = "64Gi"
GPU_TAINT = {"key": GPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
KWOK_ANNOTATION = "kwok.x-k8s.io/node"


@dataclass(frozen=True)
class NodePool:
    """A set of identical nodes; ``gpus == 0`` makes ordinary CPU nodes."""

    prefix: str
    count: int
    cpus: int
    memory: str
    gpus: int = 0
    gpu_product: str = ""
    pods: int = 110
    cliques: int = 0  # NVLink domains the pool's nodes are split into (0: no clique label)

    def clique(self, index: int) -> str | None:
        """The clique of node ``index``: consecutive nodes share one, as trays share a rack."""
        if not self.cliques:
            return None
        per_clique = -(-self.count // self.cliques)
        return f"{FAKE_CLUSTER_UUID}.{index // per_clique}"


# A CPU node's CPUs (where routers run: no GPU, no toleration).
CPU_NODE_CPUS = 32


def default_pools(
    gpu_nodes: int = 4,
    gpu_product: str = "NVIDIA-B200",
    gpus_per_node: int = 8,
    cpu_nodes: int = 2,
    gpu_cliques: int = 0,
) -> list[NodePool]:
    """The shape of a small Blackwell cluster: GPU workers (224 CPUs, 2 TiB) plus CPU nodes;
    ``gpu_cliques`` > 0 splits the GPU nodes into that many NVLink domains (GB200 NVL72)."""
    if gpu_nodes < 0 or cpu_nodes < 0:
        raise ValueError("node counts must be >= 0")
    if gpus_per_node < 1:
        raise ValueError("gpus per node must be >= 1")
    if gpu_cliques < 0 or gpu_cliques > gpu_nodes:
        raise ValueError(
            f"--gpu-cliques {gpu_cliques}: must be between 0 and --gpu-nodes ({gpu_nodes})"
        )
    slug = gpu_product.lower().removeprefix("nvidia-")
    return [
        NodePool(
            prefix=f"gpu-{slug}",
            count=gpu_nodes,
            cpus=224,
            memory="2Ti",
            gpus=gpus_per_node,
            gpu_product=gpu_product,
            cliques=gpu_cliques,
        ),
        NodePool(prefix="cpu", count=cpu_nodes, cpus=CPU_NODE_CPUS, memory="128Gi"),
    ]


def node_manifest(pool: NodePool, index: int) -> dict[str, Any]:
    name = f"{pool.prefix}-{index}"
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
    }
    capacity: dict[str, str] = {
        "cpu": str(pool.cpus),
        "memory": pool.memory,
        "pods": str(pool.pods),
        "ephemeral-storage": "4Ti",
    }
    spec: dict[str, Any] = {}
    if pool.gpus:
        labels[GPU_PRODUCT_LABEL] = pool.gpu_product
        labels[GPU_COUNT_LABEL] = str(pool.gpus)
        capacity[GPU_RESOURCE] = str(pool.gpus)
        capacity[RDMA_RESOURCE] = str(pool.gpus)
        capacity["hugepages-1Gi"] = GPU_NODE_HUGEPAGES
        clique = pool.clique(index)
        if clique is not None:
            labels[GPU_CLIQUE_LABEL] = clique
        spec["taints"] = [dict(GPU_TAINT)]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": spec,
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def node_manifests(pools: list[NodePool]) -> list[dict[str, Any]]:
    return [node_manifest(pool, i) for pool in pools for i in range(pool.count)]
