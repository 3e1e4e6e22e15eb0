"""Reference engine servers as real subprocesses on loopback, with bounded waits."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator

import pytest

READY_TIMEOUT_S = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def free_port() -> Callable[[], int]:
    return _free_port


def engine_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "dsv4_engine.cli", *args]


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {proc.stderr.read()}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"{url}/health not ready after {timeout_s}s")


def _servers() -> Iterator[Callable[..., str]]:
    """start(*flags, env={...}) -> base URL; every server started is stopped at the end."""
    procs: list[subprocess.Popen] = []

    def start(*flags: str, env: dict[str, str] | None = None, cmd: str = "serve") -> str:
        port = _free_port()
        proc = subprocess.Popen(
            engine_cmd(cmd, "--port", str(port), *flags),
            env={**os.environ, **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, proc)
        return url

    yield start
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def start_server() -> Iterator[Callable[..., str]]:
    """start_server(*flags, env={...}) -> base URL; stopped when the test ends."""
    yield from _servers()


@pytest.fixture(scope="module")
def start_server_module() -> Iterator[Callable[..., str]]:
    """The same, for servers a module's tests share; stopped when the module ends."""
    yield from _servers()
