"""Per-role engine objects: StatefulSets, the headless Service, the PodDisruptionBudget.

A role with `nodesPerReplica` N > 1 has two StatefulSets: the leaders (node rank 0, one
pod per replica, the only pods serving HTTP, the ones the router discovers) and the
workers (ranks 1..N-1).  Both scale with `replicas`, so a replica change touches only the
role's own objects; `dsv4_engine.engine_config.place_pod` maps a pod's ordinal to its node
rank and rank-0 address.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dsv4_engine.engine_config import GroupRole
from dsv4_engine.features import Role
from dsv4_operator.api.names import WORKERS_SUFFIX
from dsv4_operator.api.spec import DSV4DeploymentSpec, RoleSpec
from dsv4_operator.render.engine import (
    DIST_INIT_PORT,
    ENGINE_PORT,
    MODEL_MOUNT,
    config_map_name,
    role_name,
)
from dsv4_operator.render.meta import (
    ANNOTATION_CONFIG_HASH,
    LABEL_GROUP_ROLE,
    LABEL_SLOT,
    LABEL_TRANSFER,
    Owner,
    Slot,
    metadata,
    selector_labels,
    slot_selector,
)
from dsv4_operator.render.placement import GPU_RESOURCE, pod_placement
from dsv4_operator.render.security import container_security, engine_capabilities, pod_security

CONFIG_MOUNT = "/etc/dsv4"
BOOTSTRAP_PORT_ANNOTATION = "sglang.ai/bootstrap-port"

# The memory an engine pod asks for: the user's request, plus the HiCache host tier the pool
# configurator computes when the role runs HiCache (dsv4_operator.render.memory).
HostMemory = Callable[[DSV4DeploymentSpec, Role], str]


def _resources(role_spec: RoleSpec, memory: str) -> dict[str, Any]:
    res = role_spec.resources
    amounts = {"cpu": res.cpu, "memory": memory, GPU_RESOURCE: str(role_spec.gpus_per_node)}
    if res.hugepages1_gi is not None:
        amounts["hugepages-1Gi"] = res.hugepages1_gi
    if res.rdma is not None:
        amounts[res.rdma.resource_name] = str(res.rdma.count)
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _model_volume(spec: DSV4DeploymentSpec) -> dict[str, Any]:
    if spec.model.pvc is not None:
        claim = {"claimName": spec.model.pvc.claim_name, "readOnly": True}
        return {"name": "model", "persistentVolumeClaim": claim}
    return {"name": "model", "hostPath": {"path": spec.model.host_path, "type": "Directory"}}


def _engine_container(
    spec: DSV4DeploymentSpec, role: Role, group_role: GroupRole, memory: str
) -> dict[str, Any]:
    role_spec = spec.role_spec(role)
    env = [{"name": e.name, "value": e.value} for e in role_spec.env]
    env += [
        {"name": "DSV4_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "DSV4_GROUP_ROLE", "value": group_role.value},
    ]
    ports = [{"name": "dist", "containerPort": DIST_INIT_PORT}]
    container: dict[str, Any] = {
        "name": "engine",
        "image": spec.image.name,
        "imagePullPolicy": spec.image.pull_policy.value,
        "command": ["dsv4-engine", "launch", "--config", f"{CONFIG_MOUNT}/engine.yaml"],
        "env": env,
        "resources": _resources(role_spec, memory),
        "securityContext": container_security(engine_capabilities(role_spec)),
        "volumeMounts": [
            {"name": "engine-config", "mountPath": CONFIG_MOUNT, "readOnly": True},
            {"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
    }
    if group_role is GroupRole.LEADER:
        ports.insert(0, {"name": "http", "containerPort": ENGINE_PORT})
        if role is Role.PREFILL:
            ports.append({"name": "bootstrap", "containerPort": spec.disaggregation.bootstrap_port})
        container["readinessProbe"] = {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": 10,
            "failureThreshold": 3,
        }
    container["ports"] = ports
    return container


def engine_pod_labels(owner: Owner, role: Role, slot: Slot, transfer: str) -> dict[str, str]:
    """What an engine pod says about itself: role, slot, and the transfer format it speaks
    (`FlagSet.transfer_revision`) — what a router's discovery selects on."""
    labels = selector_labels(owner, role.value)
    return {**labels, LABEL_SLOT: slot.value, LABEL_TRANSFER: transfer}


def _stateful_set(
    owner: Owner,
    spec: DSV4DeploymentSpec,
    role: Role,
    group_role: GroupRole,
    config_hash: str,
    memory: str,
    slot: Slot,
    transfer: str,
) -> dict[str, Any]:
    role_spec = spec.role_spec(role)
    base = role_name(owner, role, slot)
    name = base if group_role is GroupRole.LEADER else f"{base}{WORKERS_SUFFIX}"
    replicas = role_spec.replicas * (
        1 if group_role is GroupRole.LEADER else role_spec.nodes_per_replica - 1
    )
    selector = {**selector_labels(owner, role.value), **slot_selector(slot)}
    selector[LABEL_GROUP_ROLE] = group_role.value
    pod_labels = {**engine_pod_labels(owner, role, slot, transfer), **selector}
    annotations = {ANNOTATION_CONFIG_HASH: config_hash}
    if role is Role.PREFILL and group_role is GroupRole.LEADER:
        annotations[BOOTSTRAP_PORT_ANNOTATION] = str(spec.disaggregation.bootstrap_port)
    pod_spec = {
        # Engines never call the Kubernetes API: no token in their pods.
        "automountServiceAccountToken": False,
        "securityContext": pod_security(),
        "containers": [_engine_container(spec, role, group_role, memory)],
        "volumes": [
            {
                "name": "engine-config",
                "configMap": {
                    "name": config_map_name(owner, slot),
                    "items": [{"key": f"{role.value}.yaml", "path": "engine.yaml"}],
                },
            },
            _model_volume(spec),
            {"name": "shm", "emptyDir": {"medium": "Memory"}},
        ],
        **pod_placement(spec.placement, selector_labels(owner, role.value)),
    }
    meta = metadata(owner, name, role.value)
    meta["labels"][LABEL_SLOT] = slot.value
    # On the set itself too: status and rollout records tell a role's leaders from its workers.
    meta["labels"][LABEL_GROUP_ROLE] = group_role.value
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": meta,
        "spec": {
            "replicas": replicas,
            "serviceName": base,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": pod_labels, "annotations": annotations},
                "spec": pod_spec,
            },
        },
    }


def _headless_service(owner: Owner, role: Role, slot: Slot) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner, role_name(owner, role, slot), role.value),
        "spec": {
            "clusterIP": "None",
            # Rank 0 must be resolvable before it is Ready: the other ranks join it first.
            "publishNotReadyAddresses": True,
            "selector": {**selector_labels(owner, role.value), **slot_selector(slot)},
            "ports": [
                {"name": "http", "port": ENGINE_PORT},
                {"name": "dist", "port": DIST_INIT_PORT},
            ],
        },
    }


def _disruption_budget(owner: Owner, role: Role, role_spec: RoleSpec, slot: Slot) -> dict[str, Any]:
    """At most one replica (all its nodes) of a role disrupted at a time."""
    selector = {**selector_labels(owner, role.value), **slot_selector(slot)}
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(owner, role_name(owner, role, slot), role.value),
        "spec": {
            "maxUnavailable": role_spec.nodes_per_replica,
            "selector": {"matchLabels": selector},
        },
    }


def role_objects(
    owner: Owner,
    spec: DSV4DeploymentSpec,
    role: Role,
    config_hash: str,
    host_memory: HostMemory,
    slot: Slot,
    transfer: str,
) -> list[dict[str, Any]]:
    role_spec = spec.role_spec(role)
    memory = host_memory(spec, role)
    groups = [GroupRole.LEADER] + ([GroupRole.WORKER] if role_spec.nodes_per_replica > 1 else [])
    sets = [
        _stateful_set(owner, spec, role, g, config_hash, memory, slot, transfer) for g in groups
    ]
    return [
        *sets,
        _headless_service(owner, role, slot),
        _disruption_budget(owner, role, role_spec, slot),
    ]
