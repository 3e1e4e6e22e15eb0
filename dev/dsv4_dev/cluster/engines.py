"""The local runtime as a companion of a local cluster (`dsv4ctl cluster up --engines`).

KWOK only pretends to run pods.  With `--engines`, the cluster also starts the local runtime
(`dsv4_dev.localrun.runtime`) as a background process of its own: every engine pod of a
`engine: reference` deployment then runs the CPU reference engine, and every router pod its
router, on loopback ports published in the endpoint map.  Its state (pid, log, each
process's config and log) lives in the cluster's folder, so `down` finds and stops it, and
anything it left behind is a leftover process of that folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsv4_dev.cluster.local import ClusterError, LocalCluster
from dsv4_dev.localrun import endpoints

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
RUNTIME_MODULE = "dsv4_dev.localrun.runtime"


@dataclass(frozen=True)
class Engines:
    """The local runtime of one cluster."""

    cluster: LocalCluster

    @property
    def folder(self) -> Path:
        return self.cluster.cluster_dir / "localrun"

    @property
    def log_path(self) -> Path:
        return self.folder / "runtime.log"

    @property
    def _pid_path(self) -> Path:
        return self.folder / "runtime.pid"

    def pid(self) -> int | None:
        """The runtime's process id while it runs, else None."""
        try:
            pid = int(self._pid_path.read_text())
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) else None

    def start(self) -> int:
        """Start the runtime (once) and wait until it has published its endpoint map."""
        running = self.pid()
        if running is not None:
            return running
        self.folder.mkdir(parents=True, exist_ok=True)
        env = {**self.cluster.env, "DSV4_LOCALRUN_DIR": str(self.folder)}
        with self.log_path.open("a") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", RUNTIME_MODULE],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # outlives `dsv4ctl cluster up`, as the cluster does
            )
        self._pid_path.write_text(str(proc.pid))
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.published() is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ClusterError(
                    f"the local runtime did not start (exit {proc.poll()}); see {self.log_path}"
                )
            time.sleep(0.2)
        return proc.pid

    def stop(self) -> bool:
        """SIGTERM the runtime, which stops every process it started; True if it ran."""
        pid = self.pid()
        if pid is None:
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._pid_path.unlink(missing_ok=True)
        return True

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


def _alive(pid: int) -> bool:
    """True while ``pid`` is a running local runtime (not a zombie, exited but not yet
    reaped, nor another process that got its number since)."""
    proc = Path(f"/proc/{pid}")
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        command = (proc / "cmdline").read_bytes()
    except OSError:
        return False
    return state != "Z" and RUNTIME_MODULE.encode() in command
