"""Starting and stopping the local processes that stand in for pods' containers."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path


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


def terminate(process: subprocess.Popen) -> None:
    """SIGTERM, as kubelet stops a container, then SIGKILL after a grace period."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(5)
