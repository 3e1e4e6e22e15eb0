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

# A directory the fence is told to allow (`allowedModelHostPaths`) for HOST_PATH_ESCAPES.
MODEL_HOST_PATH = "/data/models/deepseek-v4-flash"

FENCE = "ValidatingAdmissionPolicy 'dsv4-operator-fence'"
ACCOUNTS_FENCE = "ValidatingAdmissionPolicy 'dsv4-operator-fence-accounts'"
PROBE_FENCE = "ValidatingAdmissionPolicy 'dsv4-probe-fence'"
REPORT_FENCE = "ValidatingAdmissionPolicy 'dsv4-report-fence'"
INSTANCE = "flash"
SERVED = "inference.dsv4.dev/served"  # "true" on every namespace the operator serves
SERVED_ONLY = f"the operator writes only in namespaces labelled {SERVED}=true"
IMAGE = "ghcr.io/dsv4/engine:0.1.0"  # the samples' engine: under the shipped allowedImages


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
                            "image": IMAGE,
                            "securityContext": container_security(()),
                            **(container or {}),
                        }
                    ],
                },
            },
        },
    }


# The review's claim: bound by name to a hostPath PersistentVolume of `/`.
ROOT_CLAIM = {
    "metadata": {"name": "root"},
    "spec": {
        "volumeName": "host-root",
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}},
    },
}


def leader_worker_set(namespace: str, claims: list[dict[str, Any]]) -> dict[str, Any]:
    """A LeaderWorkerSet of no replicas whose pods are ``workload``'s, with ``claims``."""
    template = workload(namespace)["spec"]["template"]
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": meta(namespace, "escape"),
        "spec": {
            "replicas": 0,
            "leaderWorkerTemplate": {
                "size": 1,
                "workerTemplate": template,
                "volumeClaimTemplates": claims,
            },
        },
    }


def stateful_set(namespace: str, claims: list[dict[str, Any]]) -> dict[str, Any]:
    """A StatefulSet whose pod is ``workload``'s, with ``claims`` as its volumeClaimTemplates."""
    made = workload(namespace)
    made["kind"] = "StatefulSet"
    made["spec"]["volumeClaimTemplates"] = claims
    return made


def job(namespace: str, container: dict[str, Any]) -> dict[str, Any]:
    """A Job (what the operator runs probes as) whose pod is ``workload``'s."""
    template = workload(namespace, container=container)["spec"]["template"]
    template["spec"]["restartPolicy"] = "Never"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta(namespace, "escape"),
        "spec": {"template": template},
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
    "privileged-job": (
        lambda ns: job(ns, container={"securityContext": {"privileged": True}}),
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
    # A tenant's exploits, were the operator to render them (`api.allowed` refuses both
    # first): another registry's image, or a toleration of every taint (a GPU pool kept
    # for someone else by its taint).
    "image-outside-the-allow-list": (
        lambda ns: workload(ns, container={"image": "ghcr.io/dsv4-evil/engine:1"}),
        "container(s) c (ghcr.io/dsv4-evil/engine:1) run an image outside allowedImages",
    ),
    "toleration-outside-the-allow-list": (
        lambda ns: workload(ns, pod={"tolerations": [{"operator": "Exists"}]}),
        "toleration(s) * outside allowedTolerations [nvidia.com/gpu:NoSchedule]",
    ),
    # Rule 7: the review's creates that the fence admitted (issue 62).
    "node-name": (
        lambda ns: workload(ns, pod={"nodeName": "control-plane-0"}),
        "nodeName control-plane-0",
    ),
    "priority-class": (
        lambda ns: workload(ns, pod={"priorityClassName": "system-node-critical"}),
        "priorityClassName system-node-critical outside allowedPriorityClasses",
    ),
    "runtime-class": (
        lambda ns: workload(ns, pod={"runtimeClassName": "runc-privileged"}),
        "runtimeClassName runc-privileged",
    ),
    "seccomp-unconfined": (
        lambda ns: workload(
            ns,
            container={
                "securityContext": {
                    **container_security(()),
                    "seccompProfile": {"type": "Unconfined"},
                }
            },
        ),
        "c seccompProfile Unconfined",
    ),
    "apparmor-unconfined": (
        lambda ns: workload(
            ns,
            pod={"securityContext": {**pod_security(), "appArmorProfile": {"type": "Unconfined"}}},
        ),
        "appArmorProfile Unconfined",
    ),
    "selinux-spc": (
        lambda ns: workload(
            ns, pod={"securityContext": {**pod_security(), "seLinuxOptions": {"type": "spc_t"}}}
        ),
        "seLinuxOptions",
    ),
    "unsafe-sysctl": (
        lambda ns: workload(
            ns,
            pod={
                "securityContext": {
                    **pod_security(),
                    "sysctls": [{"name": "kernel.msgmax", "value": "65536"}],
                }
            },
        ),
        "sysctls",
    ),
    "root-group": (
        lambda ns: workload(ns, pod={"securityContext": {**pod_security(), "runAsGroup": 0}}),
        "runAsGroup 0",
    ),
    "unbounded-memory-empty-dir": (
        lambda ns: workload(
            ns, pod={"volumes": [{"name": "ram", "emptyDir": {"medium": "Memory"}}]}
        ),
        "emptyDir ram without a sizeLimit",
    ),
    "volume-claim-template": (
        lambda ns: stateful_set(ns, [ROOT_CLAIM]),
        "volumeClaimTemplates",
    ),
    "lws-volume-claim-template": (
        lambda ns: leader_worker_set(ns, [ROOT_CLAIM]),
        "volumeClaimTemplates",
    ),
    # A device of the tenant's choosing as an engine's "RDMA" (`api.allowed` refuses it first).
    "device-outside-the-allow-list": (
        lambda ns: workload(
            ns, container={"resources": {"limits": {"devices.kubevirt.io/kvm": "1"}}}
        ),
        "resource(s) devices.kubevirt.io/kvm are neither what the operator sets itself",
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


# Rule 7 for a model directory the settings allow (refused by rule 4 first otherwise): the
# test allows MODEL_HOST_PATH while it runs them.
HOST_PATH_ESCAPES: dict[str, tuple[Callable[[str], dict[str, Any]], str]] = {
    "host-path-socket": (
        lambda ns: workload(
            ns,
            pod={
                "volumes": [
                    {
                        "name": "model",
                        "hostPath": {"path": MODEL_HOST_PATH, "type": "Socket"},
                    }
                ]
            },
        ),
        "hostPath model not of type Directory",
    ),
    "host-path-read-write": (
        lambda ns: workload(
            ns,
            pod={
                "volumes": [
                    {"name": "model", "hostPath": {"path": MODEL_HOST_PATH, "type": "Directory"}}
                ]
            },
            container={"volumeMounts": [{"name": "model", "mountPath": "/models"}]},
        ),
        "c mounts hostPath model read-write",
    ),
}


def role_binding(
    namespace: str, name: str, role_ref: dict[str, str], account: str
) -> dict[str, Any]:
    """A RoleBinding labelled as the operator's, of ``role_ref`` to ``account``."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": meta(namespace, name),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", **role_ref},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }


# A grant the operator's token holds itself, so RBAC's escalation check lets it through:
# what the reported hand-off gives `<x>-router` (patch any workload, whatever its labels).
HAND_OFF_RULES = [
    {"apiGroups": ["apps"], "resources": ["deployments", "statefulsets"], "verbs": ["patch"]}
]
BINDS_ONLY = "the operator binds only the ClusterRole dsv4-router to <instance>-router"


def refuses_the_hand_off(
    kubectl: Callable[..., Any], kubeconfig: Path, namespace: str, account: str
) -> None:
    """The reported RBAC escalation, step by step, with the operator's token: write a Role
    of rights it holds, or bind one (made by someone else: ``kubectl``, the admin's), or a
    ClusterRole other than the one an account of its own is for, to ``account`` (one it
    made, `<instance>-router` or `-probe`, so that only rule 6 stands in the way): RBAC
    refuses the first, the fence the others.
    And it cannot take over a DSV4Deployment's spec (no write on the resource at all)."""
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": meta(namespace, "hand-off"),
        "rules": HAND_OFF_RULES,
    }
    message = refused(kubeconfig, role)
    assert 'cannot create resource "roles"' in message, message
    kubectl("apply", "-f", "-", input=json.dumps(role))
    other = "dsv4-probe" if account.endswith("-router") else "dsv4-router"
    for role_ref in (
        {"kind": "Role", "name": "hand-off"},
        {"kind": "ClusterRole", "name": other},  # the other account's grant
    ):
        message = refused(kubeconfig, role_binding(namespace, "hand-off", role_ref, account))
        assert FENCE in message and BINDS_ONLY in message, (role_ref, message)
    for change in (
        ("patch", "dsv4deployments", INSTANCE, "--type=merge", "-p", '{"spec": {"engine": "x"}}'),
        ("annotate", "dsv4deployments", INSTANCE, "inference.dsv4.dev/rollout-action=abort/t/r"),
    ):
        result = as_account(kubeconfig, *change, "-n", namespace)
        assert result.returncode != 0, result.stdout
        assert 'cannot patch resource "dsv4deployments"' in result.stderr, result.stderr


def refused(kubeconfig: Path, obj: dict[str, Any]) -> str:
    """The API server's refusal of ``obj``, created with ``kubeconfig``'s token alone."""
    result = as_account(kubeconfig, "create", "-f", "-", input=json.dumps(obj))
    assert result.returncode != 0, (obj["metadata"], result.stdout)
    assert "forbidden" in result.stderr.lower(), result.stderr
    return result.stderr
