"""Starting and stopping the local processes that stand in for pods' containers.

The project's own commands (an engine's `serve`, a probe Job's `dsv4ctl probe`) are forked
from the fork server (`forks`): the same argv, environment, log and session as a fresh
process, without each one importing torch again.  Anything else (sglang-router, which
imports little as the router pod runs it, podman, Prometheus) is started as it is.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Protocol

from dsv4_dev import images
from dsv4_dev.localrun.forks import ForkServer, fork_target

FORKS = ForkServer()


class Started(Protocol):
    """What the runtime asks of a started process (`subprocess.Popen` and `forks.Forked`)."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def popen(command: list[str], env: dict[str, str], log_path: Path) -> Started:
    """``command`` in its own session (so stopping it stops its children too), its output
    appended to ``log_path``, with ``env`` over this process's environment.  The
    project's own commands are forked (see the module)."""
    if fork_target(command, env) is not None:
        return FORKS.fork(command, env, log_path)
    with log_path.open("a") as out:
        return subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            start_new_session=True,
        )


def terminate(process: Started, container: str | None = None) -> None:
    """SIGTERM, as kubelet stops a container, then SIGKILL after a grace period.  For a
    process that is `podman run` of ``container``, the container goes too: podman passes
    the SIGTERM on, but a `run` killed past its grace leaves its container behind."""
    if process.poll() is None:
        _signal(process, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            _signal(process, signal.SIGKILL)
            process.wait(5)
    if container is not None:
        images.podman("rm", "--force", "--ignore", container)


def _signal(process: Started, sig: signal.Signals) -> None:
    """``sig`` to the process's session; to the process alone if it has not made its
    session yet (a fork stopped the instant it started)."""
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        try:
            os.kill(process.pid, sig)
        except ProcessLookupError:
            pass  # it has just exited: wait() collects it
