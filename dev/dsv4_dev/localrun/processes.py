"""Starting and stopping the local processes that stand in for pods' containers."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from dsv4_dev import images


def popen(command: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
    """``command`` in its own session (so stopping it stops its children too), its output
    appended to ``log_path``, with ``env`` over this process's environment."""
    with log_path.open("a") as out:
        return subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            start_new_session=True,
        )


def terminate(process: subprocess.Popen, container: str | None = None) -> None:
    """SIGTERM, as kubelet stops a container, then SIGKILL after a grace period.  For a
    process that is `podman run` of ``container``, the container goes too: podman passes
    the SIGTERM on, but a `run` killed past its grace leaves its container behind."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)
    if container is not None:
        images.podman("rm", "--force", "--ignore", container)
