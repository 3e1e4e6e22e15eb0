"""The security context of every pod the operator renders, and why each setting.

Every pod runs as the non-root user its image was built with, under the runtime's default
seccomp profile, without privilege escalation, with every Linux capability dropped and a
read-only root filesystem (writes go to a size-limited emptyDir, `Scratch`).
The one capability ever added back is IPC_LOCK, and only to engine pods that are given an
RDMA device: registering memory with an RDMA NIC (`ibv_reg_mr`, what Mooncake and NIXL
transfers do) pins it, which the kernel allows beyond RLIMIT_MEMLOCK only with IPC_LOCK,
and Kubernetes has no per-pod memlock limit to raise instead.  GPUs need no capability:
the device plugin hands the container its device nodes.

Pod Security levels follow (tests/e2e/test_pod_security.py asks the API server): engine
pods meet `restricted` with the model on a PVC; IPC_LOCK and a hostPath volume are beyond
`baseline`, so an RDMA role or a hostPath model needs a `privileged` namespace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dsv4_operator.api.spec import RoleSpec

# The user of images/engine/Dockerfile and images/operator/Dockerfile (`USER 10001:10001`).
IMAGE_UID = 10001
IPC_LOCK = "IPC_LOCK"
# The engine image's HOME (images/engine/Dockerfile), where Triton, FlashInfer, DeepGEMM and
# torch keep their JIT caches: writable scratch, like /tmp, under a read-only root.
ENGINE_HOME = "/home/dsv4"
EPHEMERAL_STORAGE = "ephemeral-storage"


def pod_security() -> dict[str, Any]:
    """The pod-level context: the image's non-root user, RuntimeDefault seccomp."""
    return {
        "runAsNonRoot": True,
        "runAsUser": IMAGE_UID,
        "runAsGroup": IMAGE_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security(add: tuple[str, ...] = ()) -> dict[str, Any]:
    """The container-level context: no escalation, every capability dropped but ``add``, a
    read-only root filesystem (what a process writes goes to its `Scratch`)."""
    capabilities: dict[str, list[str]] = {"drop": ["ALL"]}
    if add:
        capabilities["add"] = list(add)
    return {
        "allowPrivilegeEscalation": False,
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
        "capabilities": capabilities,
    }


@dataclass(frozen=True)
class Scratch:
    """Where a container whose root filesystem is read-only writes: one emptyDir of
    ``size``, a sub-directory of it mounted at each of ``paths``; the container asks for
    ``size`` of ephemeral storage and is limited to ``limit`` (the scratch, plus its logs
    and what else the kubelet counts), so a runaway writer is evicted, not a node's disk
    filled."""

    size: str
    limit: str
    paths: tuple[str, ...]

    NAME = "scratch"

    def volume(self) -> dict[str, Any]:
        return {"name": self.NAME, "emptyDir": {"sizeLimit": self.size}}

    def mounts(self) -> list[dict[str, Any]]:
        return [
            {"name": self.NAME, "mountPath": path, "subPath": path.strip("/").replace("/", "-")}
            for path in self.paths
        ]

    def storage(self) -> tuple[dict[str, str], dict[str, str]]:
        """The container's ephemeral-storage (requests, limits)."""
        return {EPHEMERAL_STORAGE: self.size}, {EPHEMERAL_STORAGE: self.limit}


def engine_capabilities(role_spec: RoleSpec) -> tuple[str, ...]:
    """IPC_LOCK for a role given an RDMA device (see the module docstring); none otherwise."""
    return (IPC_LOCK,) if role_spec.resources.rdma is not None else ()
