"""The security context of every pod the operator renders, and why each setting.

Every pod runs as the non-root user its image was built with, under the runtime's default
seccomp profile, without privilege escalation and with every Linux capability dropped.
The one capability ever added back is IPC_LOCK, and only to engine pods that are given an
RDMA device: registering memory with an RDMA NIC (`ibv_reg_mr`, what Mooncake and NIXL
transfers do) pins it, which the kernel allows beyond RLIMIT_MEMLOCK only with IPC_LOCK,
and Kubernetes has no per-pod memlock limit to raise instead.  GPUs need no capability:
the device plugin hands the container its device nodes.

Pod Security levels follow (tests/e2e/test_namespaced_install.py asks the API server): engine
pods meet `restricted` with the model on a PVC; IPC_LOCK and a hostPath volume are beyond
`baseline`, so an RDMA role or a hostPath model needs a `privileged` namespace.
"""

from __future__ import annotations

from typing import Any

from dsv4_operator.api.spec import RoleSpec

# The user of images/engine/Dockerfile and images/operator/Dockerfile (`USER 10001:10001`).
IMAGE_UID = 10001
IPC_LOCK = "IPC_LOCK"


def pod_security() -> dict[str, Any]:
    """The pod-level context: the image's non-root user, RuntimeDefault seccomp."""
    return {
        "runAsNonRoot": True,
        "runAsUser": IMAGE_UID,
        "runAsGroup": IMAGE_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security(add: tuple[str, ...] = (), read_only_root: bool = False) -> dict[str, Any]:
    """The container-level context: no escalation, every capability dropped but ``add``."""
    capabilities: dict[str, list[str]] = {"drop": ["ALL"]}
    if add:
        capabilities["add"] = list(add)
    context: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "runAsNonRoot": True,
        "capabilities": capabilities,
    }
    if read_only_root:
        context["readOnlyRootFilesystem"] = True
    return context


def engine_capabilities(role_spec: RoleSpec) -> tuple[str, ...]:
    """IPC_LOCK for a role given an RDMA device (see the module docstring); none otherwise."""
    return (IPC_LOCK,) if role_spec.resources.rdma is not None else ()
