"""A ServiceAccount's identity for a local process: a short-lived token from the TokenRequest
API in a kubeconfig of its own.

A pod's containers reach the API server as their ServiceAccount, with a token kubelet asks
for and mounts; a local process standing in for such a container (a probe Job's pod, run by
the local runtime) or a test acting as an account gets the same kind of token, so the API
server judges each request by that account's RBAC — never by the admin's credential.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import yaml

# kubelet asks for an hour (and refreshes it); a probe's own deadline is shorter.
TOKEN_SECONDS = 3600


def request_token(
    core: Any, namespace: str, account: str, pod: tuple[str, str] | None = None
) -> str:
    """A token of ``account`` (``core``: a CoreV1Api).  ``pod`` (name, uid) binds it to that
    pod, as kubelet's are: the API server stops honouring it once the pod is gone."""
    from kubernetes import client

    bound = None
    if pod is not None:
        bound = client.V1BoundObjectReference(api_version="v1", kind="Pod", name=pod[0], uid=pod[1])
    spec = client.V1TokenRequestSpec(
        audiences=[], expiration_seconds=TOKEN_SECONDS, bound_object_ref=bound
    )
    answer = core.create_namespaced_service_account_token(
        account, namespace, client.AuthenticationV1TokenRequest(spec=spec)
    )
    return answer.status.token


def token_kubeconfig(admin_kubeconfig: str | Path, user: str, token: str) -> dict[str, Any]:
    """A kubeconfig for the cluster ``admin_kubeconfig``'s current context points at, whose
    only credential is ``token``.  Self-contained (the cluster's CA inline, not a path), so
    it works wherever it is mounted, inside a container too."""
    admin = yaml.safe_load(Path(admin_kubeconfig).read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])
    name = context["context"]["cluster"]
    cluster = dict(next(c for c in admin["clusters"] if c["name"] == name)["cluster"])
    if "certificate-authority" in cluster:
        ca = Path(cluster.pop("certificate-authority")).read_bytes()
        cluster["certificate-authority-data"] = base64.b64encode(ca).decode()
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": name, "user": user}}],
        "current-context": user,
    }


def write_kubeconfig(path: Path, config: dict[str, Any], owner: int | None = None) -> Path:
    """``config`` at ``path``, readable by its owner only (it holds a credential): this
    user, or the user ``owner`` (a container's, as kubelet hands a pod's token to it)."""
    path.touch(mode=0o600)
    path.write_text(yaml.safe_dump(config))
    if owner is not None:
        os.chown(path, owner, -1)
    return path
