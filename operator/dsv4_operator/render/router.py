"""The PD router: `sglang-router` discovering prefill and decode leaders by label.

Discovery by label selector (not a list of URLs) keeps the router's objects unchanged
when a role's replica count changes; it needs to list and watch pods, hence its own
ServiceAccount, bound in its namespace to the ClusterRole the install ships for it
(`ROUTER_CLUSTER_ROLE`).  It is the only pod of a deployment that gets a token.  Each slot has its own router Deployment, which
selects only its slot's leaders of one transfer format (see `Slot`); one Service fronts
them all.
"""

from __future__ import annotations

from typing import Any

from dsv4_engine.engine_config import GroupRole
from dsv4_engine.features import Role
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.render.engine import ENGINE_PORT
from dsv4_operator.render.meta import (
    LABEL_GROUP_ROLE,
    LABEL_SLOT,
    Owner,
    Slot,
    metadata,
    selector_labels,
    slot_selector,
)
from dsv4_operator.render.rbac import cluster_role_identity
from dsv4_operator.render.security import ENGINE_HOME, Scratch, container_security, pod_security
from dsv4_operator.render.workloads import engine_pod_labels

ROUTER_PORT = 8000
# sglang-router 0.3.2 serves its own Prometheus page (`smg_*` series: requests, errors,
# TTFT, worker health) on a port of its own, 29000 by default (router_args.py): named
# `metrics` here, where the shipped PodMonitor `dsv4-routers` scrapes it.
ROUTER_METRICS_PORT = 29000
READINESS_PATH = "/readiness"
COMPONENT = "router"
# Shipped by the install (manifests/base/rbac.yaml), bound per deployment.  sglang-router's
# service discovery is a kube-rs `watcher` on the pods of one namespace: list and watch.
ROUTER_CLUSTER_ROLE = "dsv4-router"
ROUTER_RULES = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]
DISCOVERY_SUFFIX = "-discovery"
# sglang-router (Rust) keeps its cache-aware radix tree of recent prompts in memory; it
# writes nothing it needs to keep.  It runs the engine image unless `router.image` names
# another, hence scratch at the engine image's HOME as well as /tmp.
ROUTER_CPU = ("1", "4")  # (request, limit)
ROUTER_MEMORY = ("2Gi", "8Gi")
# A terminating router keeps answering this long before its SIGTERM: clients stop sending
# to it only once its endpoint's removal has reached them (kube-proxy, a gateway), and its
# slot's last engines (a paired promotion's Retire) go only once its pod has.
ROUTER_DRAIN_S = 5
ROUTER_SCRATCH = Scratch(size="1Gi", limit="2Gi", paths=(ENGINE_HOME, "/tmp"))
# sglang-router 0.3.2's launcher (`python3 -m sglang_router.launch_router`) imports its
# Python MiniLB (`--mini-lb`, a debugging balancer), and MiniLB imports SGLang's tracing
# wherever SGLang is installed, as on the engine image routers run by default: all of
# SGLang with torch and Triton, ~10 CPU-s and hundreds of MB before the Rust router
# serves.  The container marks that optional import absent (None in sys.modules makes it
# raise ImportError, which MiniLB catches and goes without) and runs the launcher's own
# `main` on its arguments: sglang-router's code only, so any image with it runs this.
ROUTER_LAUNCHER = (
    "import sys; sys.modules['sglang.srt.tracing.trace'] = None; "
    "from sglang_router.launch_router import main; main()"
)
ROUTER_COMMAND = ("python3", "-c", ROUTER_LAUNCHER)


def router_name(owner: Owner, slot: Slot = Slot.BLUE) -> str:
    """The router Deployment of ``slot``; the Service in front of every slot's routers is
    `router_name(owner)`, the one name clients use."""
    return f"{owner.name}-router{slot.suffix}"


def _selector_args(owner: Owner, role: Role, slot: Slot, transfer: str) -> list[str]:
    labels = {
        **engine_pod_labels(owner, role, slot, transfer),
        LABEL_GROUP_ROLE: GroupRole.LEADER.value,
    }
    return [f"{key}={value}" for key, value in labels.items()]


def router_args(owner: Owner, spec: DSV4DeploymentSpec, slot: Slot, transfer: str) -> list[str]:
    """sglang-router in PD mode discovering its workers by label: only the leaders of its
    own slot that speak its transfer format, so it can never pair a prefill and a decode
    of different formats (sglang-router 0.3.2 matches every key=value given)."""
    return [
        "--pd-disaggregation",
        "--host", "0.0.0.0",
        "--port", str(ROUTER_PORT),
        "--prometheus-port", str(ROUTER_METRICS_PORT),
        "--policy", spec.router.policy.value,
        "--service-discovery",
        "--service-discovery-namespace", owner.namespace,
        "--service-discovery-port", str(ENGINE_PORT),
        "--prefill-selector", *_selector_args(owner, Role.PREFILL, slot, transfer),
        "--decode-selector", *_selector_args(owner, Role.DECODE, slot, transfer),
    ]  # fmt: skip


def _router_resources() -> dict[str, Any]:
    storage_request, storage_limit = ROUTER_SCRATCH.storage()
    return {
        "requests": {"cpu": ROUTER_CPU[0], "memory": ROUTER_MEMORY[0], **storage_request},
        "limits": {"cpu": ROUTER_CPU[1], "memory": ROUTER_MEMORY[1], **storage_limit},
    }


def router_deployment(
    owner: Owner, spec: DSV4DeploymentSpec, slot: Slot, transfer: str
) -> dict[str, Any]:
    """The routers of one slot; every slot's router pods sit behind the one Service."""
    labels = selector_labels(owner, COMPONENT)
    container = {
        "name": "router",
        "image": spec.router.image or spec.image.name,
        "imagePullPolicy": spec.image.pull_policy.value,
        "command": list(ROUTER_COMMAND),
        "args": router_args(owner, spec, slot, transfer),
        "ports": [
            {"name": "http", "containerPort": ROUTER_PORT},
            {"name": "metrics", "containerPort": ROUTER_METRICS_PORT},
        ],
        # sglang-router 0.3.2 answers /health 200 whatever its workers do; /readiness is 503
        # until it has a healthy worker of each kind (tests/integration/test_sglang_router.py).
        "readinessProbe": {
            "httpGet": {"path": READINESS_PATH, "port": "http"},
            "periodSeconds": 10,
        },
        "lifecycle": {"preStop": {"sleep": {"seconds": ROUTER_DRAIN_S}}},
        "resources": _router_resources(),
        "securityContext": container_security(),
        "volumeMounts": ROUTER_SCRATCH.mounts(),
    }
    meta = metadata(owner, router_name(owner, slot), COMPONENT)
    meta["labels"][LABEL_SLOT] = slot.value
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": spec.router.replicas,
            "selector": {"matchLabels": {**labels, **slot_selector(slot)}},
            "template": {
                "metadata": {"labels": {**labels, LABEL_SLOT: slot.value}},
                "spec": {
                    "serviceAccountName": router_name(owner),
                    # The one pod that calls the API (its discovery): its own account's token.
                    "automountServiceAccountToken": True,
                    "securityContext": pod_security(),
                    "containers": [container],
                    "volumes": [ROUTER_SCRATCH.volume()],
                },
            },
        },
    }


def router_shared(owner: Owner) -> list[dict[str, Any]]:
    """What every slot's routers share: their identity (listing pods is how they discover
    workers), the Service clients call, in front of all of them, and their disruption
    budget."""
    name = router_name(owner)
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner, name, COMPONENT),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(owner, COMPONENT),
            "ports": [{"name": "http", "port": ROUTER_PORT, "targetPort": "http"}],
        },
    }
    # Every slot's routers serve behind the one Service: a node drain takes one at a time,
    # so a deployment with more than one router keeps serving through it.
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(owner, name, COMPONENT),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(owner, COMPONENT)},
        },
    }
    account = cluster_role_identity(
        owner, name, f"{name}{DISCOVERY_SUFFIX}", COMPONENT, ROUTER_CLUSTER_ROLE
    )
    return [*account, service, budget]
