"""The PD router: `sglang-router` discovering prefill and decode leaders by label.

Discovery by label selector (not a list of URLs) keeps the router's objects unchanged
when a role's replica count changes; it needs to list pods, hence its own
ServiceAccount, Role and RoleBinding.
"""

from __future__ import annotations

from typing import Any

from dsv4_engine.engine_config import GroupRole
from dsv4_engine.features import Role
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.render.engine import ENGINE_PORT
from dsv4_operator.render.meta import LABEL_GROUP_ROLE, Owner, metadata, selector_labels
from dsv4_operator.render.rbac import identity

ROUTER_PORT = 8000
COMPONENT = "router"


def router_name(owner: Owner) -> str:
    return f"{owner.name}-router"


def _selector_args(owner: Owner, role: Role) -> list[str]:
    labels = {**selector_labels(owner, role.value), LABEL_GROUP_ROLE: GroupRole.LEADER.value}
    return [f"{key}={value}" for key, value in labels.items()]


def router_args(owner: Owner, spec: DSV4DeploymentSpec) -> list[str]:
    return [
        "--pd-disaggregation",
        "--host", "0.0.0.0",
        "--port", str(ROUTER_PORT),
        "--policy", spec.router.policy.value,
        "--service-discovery",
        "--service-discovery-namespace", owner.namespace,
        "--service-discovery-port", str(ENGINE_PORT),
        "--prefill-selector", *_selector_args(owner, Role.PREFILL),
        "--decode-selector", *_selector_args(owner, Role.DECODE),
    ]  # fmt: skip


def router_objects(owner: Owner, spec: DSV4DeploymentSpec) -> list[dict[str, Any]]:
    name = router_name(owner)
    labels = selector_labels(owner, COMPONENT)
    container = {
        "name": "router",
        "image": spec.router.image or spec.image.name,
        "imagePullPolicy": spec.image.pull_policy.value,
        "command": ["python3", "-m", "sglang_router.launch_router"],
        "args": router_args(owner, spec),
        "ports": [{"name": "http", "containerPort": ROUTER_PORT}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10},
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(owner, name, COMPONENT),
        "spec": {
            "replicas": spec.router.replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"serviceAccountName": name, "containers": [container]},
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(owner, name, COMPONENT),
        "spec": {
            "type": "ClusterIP",
            "selector": labels,
            "ports": [{"name": "http", "port": ROUTER_PORT, "targetPort": "http"}],
        },
    }
    pods = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    return [*identity(owner, name, COMPONENT, [pods]), deployment, service]
