"""sglang-router, the router the operator deploys, started on loopback beside reference
engines for development and benchmarks (the local runtime starts it for router pods:
`localrun.runtime.router_command`).  Its address and metrics port are its own."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from dsv4_operator.render.router import ROUTER_COMMAND

LAUNCH = (sys.executable, *ROUTER_COMMAND[1:])  # the router pod's command, this venv's python
READY_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(url: str, timeout_s: float = READY_TIMEOUT_S, status: int = 200) -> None:
    """Until GET ``url`` answers ``status`` (bounded); TimeoutError naming the last answer."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == status:
                    return
                last = resp.status
        except urllib.error.HTTPError as err:
            if err.code == status:
                return
            last = err.code
        except OSError as err:
            last = err
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer {status} within {timeout_s:g} s (last: {last})")


@contextlib.contextmanager
def running(
    args: list[str], log: Path, env: dict[str, str] | None = None, ready: str = "/readiness"
) -> Iterator[str]:
    """sglang-router with ``args`` on a loopback port of its own (its metrics port too); its
    base URL once ``ready`` answers 200 (`/readiness`: once it has registered a healthy
    worker of each kind, which it does after it starts serving; `/health` answers at once).
    Stopped at the end."""
    port, metrics = free_port(), free_port()
    argv = [*LAUNCH, *args, "--host", "127.0.0.1", "--port", str(port),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics)]  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env or dict(os.environ)
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(f"{url}{ready}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def pd_args(prefill: str, bootstrap_port: int, decode: str) -> list[str]:
    """PD mode in front of one prefill (with its bootstrap port) and one decode server."""
    return ["--pd-disaggregation", "--prefill", prefill, str(bootstrap_port), "--decode", decode]
