"""Per-role engine objects: the workload, its headless Service, the PodDisruptionBudget.

One pod template per place in a replica (`_pod_template`), two wrappers:

- a single-node role (`nodesPerReplica` 1) is a StatefulSet: one pod is one replica, so a
  StatefulSet already restarts and rolls replica by replica, and such a deployment needs
  nothing installed beyond Kubernetes;
- a multi-node role is a LeaderWorkerSet (kubernetes-sigs/lws): one group of N pods per
  replica, the leader (node rank 0, the only pod serving HTTP, the one the router
  discovers) and N-1 workers.  LWS restarts a group as one (`RecreateGroupOnPodRestart`:
  SGLang's ranks cannot rejoin a running engine) and rolls group by group, so no replica
  ever runs ranks of two revisions.  Each pod finds its rank and its leader in the
  environment LWS gives it (`dsv4_engine.engine_config.place_pod`); LWS makes the group's
  headless Service itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dsv4_engine.engine_config import REVISION_ENV, GroupRole
from dsv4_engine.features import Role
from dsv4_operator.api.spec import DSV4DeploymentSpec, RoleSpec
from dsv4_operator.render.engine import (
    DIST_INIT_PORT,
    ENGINE_PORT,
    MODEL_MOUNT,
    config_map_name,
    role_name,
)
from dsv4_operator.render.lws import LWS_API_VERSION, LWS_GROUP_KEY, LWS_KIND
from dsv4_operator.render.meta import (
    ANNOTATION_CONFIG_HASH,
    ENGINE_CONTAINER,
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
from dsv4_operator.render.security import (
    ENGINE_HOME,
    Scratch,
    container_security,
    engine_capabilities,
    pod_security,
)

CONFIG_MOUNT = "/etc/dsv4"
BOOTSTRAP_PORT_ANNOTATION = "sglang.ai/bootstrap-port"

# The memory an engine pod asks for: the user's request, plus the HiCache host tier the pool
# configurator computes when the role runs HiCache (dsv4_operator.render.memory).
HostMemory = Callable[[DSV4DeploymentSpec, Role], str]


# The engine's writable scratch: its JIT caches (HOME) and /tmp.  Compiled kernels of one
# model and GPU take a few GB; the limit leaves room for the container's logs.
ENGINE_SCRATCH = Scratch(size="20Gi", limit="24Gi", paths=(ENGINE_HOME, "/tmp"))
# /dev/shm, memory-backed: SGLang's own container instructions give it 32 GB
# (`docker run --shm-size 32g`).  It counts against the pod's memory limit; the bound keeps a
# leak there from taking the HiCache host pool's share.
SHM_SIZE = "32Gi"


# The resources the operator sets in a container itself (the fence admits these and the
# allowed device resources only: fence.yaml, refusedResources).
OWN_RESOURCES = ("cpu", "memory", "ephemeral-storage", "hugepages-1Gi", GPU_RESOURCE)


def _resources(role_spec: RoleSpec, memory: str) -> dict[str, Any]:
    res = role_spec.resources
    amounts = {"cpu": res.cpu, "memory": memory, GPU_RESOURCE: str(role_spec.gpus_per_node)}
    if res.hugepages1_gi is not None:
        amounts["hugepages-1Gi"] = res.hugepages1_gi
    if res.rdma is not None:
        amounts[res.rdma.resource_name] = str(res.rdma.count)
    storage_request, storage_limit = ENGINE_SCRATCH.storage()
    return {"requests": {**amounts, **storage_request}, "limits": {**amounts, **storage_limit}}


def _model_volume(spec: DSV4DeploymentSpec) -> dict[str, Any]:
    if spec.model.pvc is not None:
        claim = {"claimName": spec.model.pvc.claim_name, "readOnly": True}
        return {"name": "model", "persistentVolumeClaim": claim}
    return {"name": "model", "hostPath": {"path": spec.model.host_path, "type": "Directory"}}


def _engine_container(
    spec: DSV4DeploymentSpec, role: Role, group_role: GroupRole, memory: str, config_hash: str
) -> dict[str, Any]:
    """The engine, told the revision of what it runs (`REVISION_ENV`): its role's
    engine-config hash, which its live counters are labelled with.  The pod template carries
    that hash already, so the variable rolls no pod a configuration change does not."""
    role_spec = spec.role_spec(role)
    env = [{"name": e.name, "value": e.value} for e in role_spec.env]
    env.append({"name": REVISION_ENV, "value": config_hash})
    ports = [{"name": "dist", "containerPort": DIST_INIT_PORT}]
    container: dict[str, Any] = {
        "name": ENGINE_CONTAINER,
        "image": spec.image.name,
        "imagePullPolicy": spec.image.pull_policy.value,
        "command": ["dsv4-engine", "launch", "--config", f"{CONFIG_MOUNT}/engine.yaml"],
        "resources": _resources(role_spec, memory),
        "securityContext": container_security(engine_capabilities(role_spec)),
        "volumeMounts": [
            {"name": "engine-config", "mountPath": CONFIG_MOUNT, "readOnly": True},
            {"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True},
            {"name": "shm", "mountPath": "/dev/shm"},
            *ENGINE_SCRATCH.mounts(),
        ],
    }
    container["env"] = env
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
    (`EngineRevision.transfer_key`) — what a router's discovery selects on."""
    labels = selector_labels(owner, role.value)
    return {**labels, LABEL_SLOT: slot.value, LABEL_TRANSFER: transfer}


def serving_labels(owner: Owner, role: Role) -> dict[str, str]:
    """The labels of a role's serving pods in every slot of the stable slice: one per
    replica, the node-rank-0 pod (what an autoscaler reads a role's load from)."""
    return {**selector_labels(owner, role.value), LABEL_GROUP_ROLE: GroupRole.LEADER.value}


def workload_kind(role_spec: RoleSpec) -> str:
    return LWS_KIND if role_spec.nodes_per_replica > 1 else "StatefulSet"


def _pod_template(
    owner: Owner,
    spec: DSV4DeploymentSpec,
    role: Role,
    group_role: GroupRole,
    config_hash: str,
    memory: str,
    slot: Slot,
    transfer: str,
) -> dict[str, Any]:
    """The pod of one place in a replica (leader or worker), whatever wraps it."""
    role_selector = selector_labels(owner, role.value)
    labels = {
        **engine_pod_labels(owner, role, slot, transfer),
        **slot_selector(slot),
        LABEL_GROUP_ROLE: group_role.value,
    }
    annotations = {ANNOTATION_CONFIG_HASH: config_hash}
    if role is Role.PREFILL and group_role is GroupRole.LEADER:
        annotations[BOOTSTRAP_PORT_ANNOTATION] = str(spec.disaggregation.bootstrap_port)
    multinode = spec.role_spec(role).nodes_per_replica > 1
    pod_spec = {
        # Engines never call the Kubernetes API: no token in their pods.
        "automountServiceAccountToken": False,
        "securityContext": pod_security(),
        "containers": [_engine_container(spec, role, group_role, memory, config_hash)],
        "volumes": [
            {
                "name": "engine-config",
                "configMap": {
                    "name": config_map_name(owner, role, config_hash, slot),
                    "items": [{"key": f"{role.value}.yaml", "path": "engine.yaml"}],
                },
            },
            _model_volume(spec),
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},
            ENGINE_SCRATCH.volume(),
        ],
        **pod_placement(spec.placement, role_selector, LWS_GROUP_KEY if multinode else None),
    }
    return {"metadata": {"labels": labels, "annotations": annotations}, "spec": pod_spec}


def _workload_metadata(owner: Owner, role: Role, slot: Slot) -> dict[str, Any]:
    meta = metadata(owner, role_name(owner, role, slot), role.value)
    meta["labels"][LABEL_SLOT] = slot.value
    return meta


def _stateful_set(
    owner: Owner, role: Role, replicas: int, template: dict[str, Any], slot: Slot
) -> dict[str, Any]:
    """A single-node role: one pod per replica."""
    selector = {**selector_labels(owner, role.value), **slot_selector(slot)}
    # In the (immutable) selector since the sets had leader and worker siblings.
    selector[LABEL_GROUP_ROLE] = GroupRole.LEADER.value
    meta = _workload_metadata(owner, role, slot)
    meta["labels"][LABEL_GROUP_ROLE] = GroupRole.LEADER.value
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": meta,
        "spec": {
            "replicas": replicas,
            "serviceName": role_name(owner, role, slot),
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector},
            "template": template,
        },
    }


def _leader_worker_set(
    owner: Owner,
    role: Role,
    role_spec: RoleSpec,
    leader: dict[str, Any],
    worker: dict[str, Any],
    slot: Slot,
) -> dict[str, Any]:
    """A multi-node role: one LWS group per replica, group size = nodes per replica."""
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": LWS_KIND,
        "metadata": _workload_metadata(owner, role, slot),
        "spec": {
            "replicas": role_spec.replicas,
            # Workers start with their leader, not after it is Ready: rank 0 becomes Ready
            # only once every rank has joined it.
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0},
            },
            "networkConfig": {"subdomainPolicy": "Shared"},
            "leaderWorkerTemplate": {
                "size": role_spec.nodes_per_replica,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader,
                "workerTemplate": worker,
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

    def template(group_role: GroupRole) -> dict[str, Any]:
        return _pod_template(owner, spec, role, group_role, config_hash, memory, slot, transfer)

    budget = _disruption_budget(owner, role, role_spec, slot)
    if workload_kind(role_spec) == LWS_KIND:
        lws = _leader_worker_set(
            owner, role, role_spec, template(GroupRole.LEADER), template(GroupRole.WORKER), slot
        )
        return [lws, budget]
    sts = _stateful_set(owner, role, role_spec.replicas, template(GroupRole.LEADER), slot)
    return [sts, _headless_service(owner, role, slot), budget]
