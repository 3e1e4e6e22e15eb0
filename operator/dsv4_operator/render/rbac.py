"""A workload's own identity: a ServiceAccount bound to a Role with just the rules it needs."""

from __future__ import annotations

from typing import Any

from dsv4_operator.render.meta import Owner, metadata

RBAC_API = "rbac.authorization.k8s.io/v1"


def identity(
    owner: Owner, name: str, component: str, rules: list[dict[str, Any]], managed: bool = True
) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding, all called ``name``, in ``owner``'s namespace."""

    def meta() -> dict[str, Any]:
        return metadata(owner, name, component, managed)  # one dict per object: no aliasing

    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta()},
        {"apiVersion": RBAC_API, "kind": "Role", "metadata": meta(), "rules": rules},
        {
            "apiVersion": RBAC_API,
            "kind": "RoleBinding",
            "metadata": meta(),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner.namespace}],
        },
    ]
