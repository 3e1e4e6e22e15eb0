"""Writes the admission fence (manifests/base/fence.yaml) must refuse the operator's token:
each an escape from what the operator is for (docs/install.md, "Security review").

Every object is labelled as the operator labels its children and otherwise is what the
operator renders (`render.security`: non-root, no privilege, every capability dropped, no
token), but for one thing: so that one rule of the fence, and only it, stands in the way,
and its message says which.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dsv4_operator.render.meta import (
    APP,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    MANAGED_BY,
)
from dsv4_operator.render.security import container_security, pod_security
from tests.e2e.helpers import as_account

FENCE = "ValidatingAdmissionPolicy 'dsv4-operator-fence'"
ACCOUNTS_FENCE = "ValidatingAdmissionPolicy 'dsv4-operator-fence-accounts'"
INSTANCE = "flash"
SERVED = "inference.dsv4.dev/served"  # "true" on every namespace the operator serves
SERVED_ONLY = f"the operator writes only in namespaces labelled {SERVED}=true"


def labels(instance: str = INSTANCE) -> dict[str, str]:
    return {LABEL_MANAGED_BY: MANAGED_BY, LABEL_NAME: APP, LABEL_INSTANCE: instance}


def meta(namespace: str, name: str, instance: str = INSTANCE) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": labels(instance)}


def workload(
    namespace: str,
    name: str = "escape",
    pod: dict[str, Any] | None = None,
    container: dict[str, Any] | None = None,
    instance: str = INSTANCE,
) -> dict[str, Any]:
    """A Deployment of no replicas whose pod is the operator's engine pod, ``pod`` and
    ``container`` merged over it."""
    selector = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(namespace, name, instance),
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": {**labels(instance), **selector}},
                "spec": {
                    "automountServiceAccountToken": False,
                    "securityContext": pod_security(),
                    **(pod or {}),
                    "containers": [
                        {
                            "name": "c",
                            "image": "busybox",
                            "securityContext": container_security(()),
                            **(container or {}),
                        }
                    ],
                },
            },
        },
    }


def service(namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    ports = [{"port": 8000}]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(namespace, "escape"),
        "spec": {"selector": labels(), "ports": ports, **spec},
    }


def network_policy(namespace: str, pod_selector: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta(namespace, "escape"),
        "spec": {"podSelector": pod_selector, "policyTypes": ["Ingress"], "ingress": [{}]},
    }


def disruption_budget(namespace: str, selector: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta(namespace, "escape"),
        "spec": {"maxUnavailable": 0, "selector": selector},
    }


def root_on_the_host(namespace: str) -> dict[str, Any]:
    """The cluster-wide install's escape: a privileged pod in the host's PID namespace
    with the node's root filesystem mounted."""
    return workload(
        namespace,
        pod={"hostPID": True, "volumes": [{"name": "root", "hostPath": {"path": "/"}}]},
        container={
            "securityContext": {"privileged": True},
            "volumeMounts": [{"name": "root", "mountPath": "/host"}],
        },
    )


ESCAPES: dict[str, tuple[Callable[[str], dict[str, Any]], str]] = {
    "privileged": (
        lambda ns: workload(ns, container={"securityContext": {"privileged": True}}),
        "container(s) c must run non-root, with allowPrivilegeEscalation false, not privileged",
    ),
    "added-capability": (
        lambda ns: workload(ns, container={"securityContext": container_security(("SYS_ADMIN",))}),
        "none added but IPC_LOCK",
    ),
    "host-pid": (
        lambda ns: workload(ns, pod={"hostPID": True}),
        "share no host namespace",
    ),
    "host-network": (
        lambda ns: workload(ns, pod={"hostNetwork": True}),
        "share no host namespace",
    ),
    "host-path-root": (
        lambda ns: workload(ns, pod={"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}),
        "volume(s) root may not be mounted",
    ),
    "secret-volume": (
        lambda ns: workload(
            ns, pod={"volumes": [{"name": "creds", "secret": {"secretName": "anything"}}]}
        ),
        "volume(s) creds may not be mounted",
    ),
    "projected-token": (
        lambda ns: workload(
            ns,
            pod={
                "volumes": [
                    {
                        "name": "token",
                        "projected": {
                            "sources": [{"serviceAccountToken": {"path": "token"}}],
                        },
                    }
                ]
            },
        ),
        "volume(s) token may not be mounted",
    ),
    "secret-env": (
        lambda ns: workload(
            ns,
            container={
                "env": [
                    {
                        "name": "STOLEN",
                        "valueFrom": {"secretKeyRef": {"name": "anything", "key": "k"}},
                    }
                ]
            },
        ),
        "container(s) c take env from a Secret",
    ),
    "secret-env-from": (
        lambda ns: workload(ns, container={"envFrom": [{"secretRef": {"name": "anything"}}]}),
        "container(s) c take env from a Secret",
    ),
    "external-ips-service": (
        lambda ns: service(ns, {"externalIPs": ["203.0.113.7"]}),
        "externalIPs (CVE-2020-8554)",
    ),
    "node-port-service": (
        lambda ns: service(ns, {"type": "NodePort"}),
        "no NodePort, LoadBalancer or ExternalName",
    ),
    "load-balancer-service": (
        lambda ns: service(ns, {"type": "LoadBalancer"}),
        "no NodePort, LoadBalancer or ExternalName",
    ),
    "allow-all-network-policy": (
        lambda ns: network_policy(ns, {}),
        "select only its own pods",
    ),
    "foreign-disruption-budget": (
        lambda ns: disruption_budget(ns, {"matchLabels": {"app": "someone-elses"}}),
        "select only its own pods",
    ),
    "another-instances-disruption-budget": (
        lambda ns: disruption_budget(ns, {"matchLabels": {LABEL_NAME: APP, LABEL_INSTANCE: "b"}}),
        "select only its own pods",
    ),
}


def refused(kubeconfig: Path, obj: dict[str, Any]) -> str:
    """The API server's refusal of ``obj``, created with ``kubeconfig``'s token alone."""
    result = as_account(kubeconfig, "create", "-f", "-", input=json.dumps(obj))
    assert result.returncode != 0, (obj["metadata"], result.stdout)
    assert "forbidden" in result.stderr.lower(), result.stderr
    return result.stderr
