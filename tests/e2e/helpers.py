"""Bounded waits on real API objects, shared by the end-to-end tests."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from dsv4_operator.cluster.local import LocalCluster
from dsv4_operator.localrun.runtime import free_port


def wait_for(
    what: str, probe: Callable[[], Any], timeout: float = 60.0, interval: float = 0.5
) -> Any:
    """Polls ``probe`` until it returns something truthy; fails with ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def get_json(cluster: LocalCluster, *args: str) -> dict[str, Any]:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def apply(cluster: LocalCluster, manifest: dict[str, Any], namespace: str = "default") -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest))


def audit_events(cluster: LocalCluster, offset: int) -> list[dict[str, Any]]:
    """Every request the API server's audit log recorded after byte `offset`, parsed."""
    with cluster.audit_log.open("rb") as log:
        log.seek(offset)
        lines = log.read().decode(errors="replace").splitlines()
    events = []
    for line in lines:
        with contextlib.suppress(ValueError):
            events.append(json.loads(line))
    return events


class Background:
    """A long-running process of a test (the operator, the local runtime), logging to a file."""

    def __init__(self, command: list[str], log: Path, env: dict[str, str]) -> None:
        self.command, self.log, self.env = command, log, env
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(
                self.command, stdout=out, stderr=subprocess.STDOUT, env=self.env
            )

    def text(self) -> str:
        return self.log.read_text()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def operator_and_runtime(
    cluster: LocalCluster, namespace: str, logs: Path, *extra: str
) -> tuple[Background, Background]:
    """The operator for one namespace, and the local runtime that runs a reference engine for
    each engine pod of a `spec.engine: reference` deployment (both returned unstarted;
    ``extra``: more `run` flags)."""
    env = {**cluster.env, "DSV4_LOCALRUN_DIR": str(logs)}
    operator = Background(
        [
            str(Path(sys.executable).with_name("dsv4-operator")), "run",
            "--namespace", namespace, "--lease-namespace", namespace, "--lease-seconds", "6",
            "--local-endpoints",
            "--resync-seconds", "2", "--health-port", str(free_port()),
            *extra,
        ],
        logs / "operator.log",
        env,
    )  # fmt: skip
    runtime = Background(
        [sys.executable, "-m", "dsv4_operator.localrun.runtime"], logs / "localrun.log", env
    )
    return operator, runtime


def account_kubeconfig(cluster: LocalCluster, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig whose only credential is a fresh token of a ServiceAccount: the API
    server then judges every request by that account's RBAC, as for its pod."""
    admin = json.loads(cluster.kubectl("config", "view", "--raw", "--minify", "-o", "json").stdout)
    token = cluster.kubectl(
        "create", "token", account, "-n", namespace, "--duration=1h"
    ).stdout.strip()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": account}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(config))
    return path
