"""A workload's own identity: a ServiceAccount bound, in its namespace only, to a ClusterRole
the install ships (the operator writes no RBAC rules)."""

from __future__ import annotations

from typing import Any

from dsv4_operator.render.meta import Owner, metadata

RBAC_API = "rbac.authorization.k8s.io/v1"
RBAC_GROUP = "rbac.authorization.k8s.io"


def _binding(
    owner: Owner, name: str, component: str, account: str, role_ref: dict[str, str]
) -> dict[str, Any]:
    return {
        "apiVersion": RBAC_API,
        "kind": "RoleBinding",
        "metadata": metadata(owner, name, component),
        "roleRef": {"apiGroup": RBAC_GROUP, **role_ref},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": owner.namespace}],
    }


def service_account(owner: Owner, name: str, component: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": metadata(owner, name, component),
    }


def cluster_role_identity(
    owner: Owner, account: str, binding: str, component: str, cluster_role: str
) -> list[dict[str, Any]]:
    """ServiceAccount ``account`` granted, in ``owner``'s namespace only, a ClusterRole the
    install ships (the operator binds it; it creates no rules of its own for it)."""
    ref = {"kind": "ClusterRole", "name": cluster_role}
    return [
        service_account(owner, account, component),
        _binding(owner, binding, component, account, ref),
    ]
