"""The local runtime publishes a process the way a Service keeps a pod's endpoint: once it
first answers, until FAILURE_THRESHOLD health checks in a row fail or it exits — one slow
answer on a busy machine must not take the only router out of its Service (seen in CI: the
users' requests through a promotion got "no local endpoint")."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from dsv4_dev.localrun import endpoints
from dsv4_dev.localrun.runtime import FAILURE_THRESHOLD, LocalRuntime, Process

ROUTER_KEY = endpoints.key("flash-router", "serving", 8000)


class Health:
    """A /health that answers 200 or 503 as the test says."""

    def __init__(self) -> None:
        self.status = 200
        health = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self.send_response(health.status)
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def router(tmp_path: Path) -> Iterator[tuple[LocalRuntime, Process, Health]]:
    health = Health()
    popen = subprocess.Popen(["sleep", "60"])
    process = Process(
        pod_uid="u1",
        pod="flash-router-abc",
        namespace="serving",
        instance="flash",
        component="router",
        ip="127.0.0.1",
        url=health.url,
        popen=popen,
    )
    runtime = LocalRuntime(core=None, workdir=tmp_path)
    runtime.processes[process.pod_uid] = process
    yield runtime, process, health
    popen.kill()
    popen.wait()
    health.server.shutdown()


def published(runtime: LocalRuntime) -> dict[str, str]:
    """The endpoint map of one pass (each pass probes every process once)."""
    runtime._health.clear()
    return runtime._endpoint_map()


def test_a_process_is_published_from_its_first_answer(router):
    runtime, process, health = router
    health.status = 503
    assert ROUTER_KEY not in published(runtime)  # not ready before it ever answered
    health.status = 200
    assert published(runtime)[ROUTER_KEY] == process.url


def test_failed_checks_below_the_threshold_keep_it_published(router):
    runtime, process, health = router
    assert published(runtime)[ROUTER_KEY] == process.url
    health.status = 503
    for _ in range(FAILURE_THRESHOLD - 1):
        assert published(runtime)[ROUTER_KEY] == process.url
    health.status = 200
    assert published(runtime)[ROUTER_KEY] == process.url
    health.status = 503  # the count starts again after a good answer
    for _ in range(FAILURE_THRESHOLD - 1):
        assert published(runtime)[ROUTER_KEY] == process.url
    assert ROUTER_KEY not in published(runtime)  # the threshold in a row: out
    health.status = 200
    assert published(runtime)[ROUTER_KEY] == process.url


def test_an_exited_process_is_unpublished_at_once(router):
    runtime, process, _ = router
    assert published(runtime)[ROUTER_KEY] == process.url
    process.popen.kill()
    process.popen.wait()
    assert ROUTER_KEY not in published(runtime)
