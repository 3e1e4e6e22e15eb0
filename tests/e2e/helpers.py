"""Bounded waits on real API objects, shared by the end-to-end tests."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dsv4_operator.cluster.local import LocalCluster


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
