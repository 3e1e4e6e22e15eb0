"""Reference engine servers as real subprocesses on loopback, with bounded waits."""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dsv4_dev.localrun import processes
from dsv4_dev.localrun.forks import ENGINE_CLI

READY_TIMEOUT_S = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def free_port() -> Callable[[], int]:
    return _free_port


def engine_cmd(*args: str) -> list[str]:
    return [*ENGINE_CLI, *args]


def wait_ready(
    url: str, proc: processes.Started, log: Path, timeout_s: float = READY_TIMEOUT_S
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {log.read_text()}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"{url}/health not ready after {timeout_s}s")


def _servers(logs: Path) -> Iterator[Callable[..., str]]:
    """start(*flags, env={...}) -> base URL; every server started is stopped at the end.
    Started as the local runtime starts engines (forked: `dsv4_dev.localrun.forks`), each
    with its log in ``logs``."""
    procs: list[processes.Started] = []

    def start(*flags: str, env: dict[str, str] | None = None, cmd: str = "serve") -> str:
        port = _free_port()
        log = logs / f"{cmd}-{port}.log"
        proc = processes.popen(engine_cmd(cmd, "--port", str(port), *flags), env or {}, log)
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, proc, log)
        return url

    yield start
    for proc in procs:
        processes.terminate(proc)


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """start_server(*flags, env={...}) -> base URL; stopped when the test ends."""
    yield from _servers(tmp_path)


@pytest.fixture(scope="module")
def start_server_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., str]]:
    """The same, for servers a module's tests share; stopped when the module ends."""
    yield from _servers(tmp_path_factory.mktemp("servers"))
