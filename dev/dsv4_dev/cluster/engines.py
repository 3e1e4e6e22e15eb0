"""The local runtime as a companion of a local cluster (`dsv4ctl cluster up --engines`).

KWOK only pretends to run pods.  With `--engines`, the cluster also starts the local runtime
(`dsv4_dev.localrun.runtime`) as a background process of its own: every engine pod of a
`engine: reference` deployment then runs the CPU reference engine, and every router pod its
router, on loopback ports published in the endpoint map.  Its state (pid, log, each
process's config and log) lives in the cluster's folder (`companion`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from dsv4_dev.cluster.companion import Companion
from dsv4_dev.cluster.local import ClusterError
from dsv4_dev.localrun import endpoints


@dataclass(frozen=True)
class Engines(Companion):
    """The local runtime of one cluster."""

    folder_name = "localrun"
    stem = "runtime"
    module = "dsv4_dev.localrun.runtime"
    what = "local runtime"

    def environment(self) -> dict[str, str]:
        return {**self.cluster.env, "DSV4_LOCALRUN_DIR": str(self.folder)}

    def started(self) -> bool:
        """Once it has published its endpoint map."""
        return self.published() is not None

    def published(self) -> dict[str, str] | None:
        """The endpoint map (`<service>.<namespace>_<port>` or an engine pod's own key → its
        loopback URL), or None before the runtime has published one."""
        result = self.cluster.kubectl(
            "get", "configmap", endpoints.NAME, "-n", endpoints.NAMESPACE,
            "-o", "jsonpath={.data}", check=False,
        )  # fmt: skip
        if result.returncode != 0:
            return None
        return json.loads(result.stdout) if result.stdout.strip() else {}

    def url(self, service: str, namespace: str, port: int | None) -> str:
        """Where ``service`` answers through the runtime: its one published port, or ``port``."""
        published = self.published() or {}
        found = {
            key: url
            for key, url in published.items()
            if (where := endpoints.service_of(key)) is not None
            and where[:2] == (service, namespace)
            and port in (None, where[2])
        }
        if len(found) != 1:
            services = [endpoints.label(k) for k in published if endpoints.service_of(k)]
            answering = ", ".join(sorted(services)) or "none"
            what = f"{service}.{namespace}" + (f":{port}" if port else "")
            raise ClusterError(
                f"no single local endpoint for Service {what}; answering now: {answering}"
            )
        return next(iter(found.values()))

    def status(self) -> dict[str, Any]:
        pid = self.pid()
        return {
            "running": pid is not None,
            "pid": pid,
            "log": str(self.log_path),
            "endpoints": (self.published() or {}) if pid is not None else {},
        }
