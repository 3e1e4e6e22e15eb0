"""Fixtures shared by every test folder."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterator

import pytest

from dsv4_engine.probe.scripted_server import ScriptedCompletionServer


def _triton_language_interpreted() -> None:
    """Without a GPU, the Triton kernel tests run under Triton's CPU interpreter
    (tests/unit/engine/hicache), whose kernels call `triton.language`'s own @triton.jit
    helpers (`tl.max`, ...): those must have been decorated for the interpreter, that is,
    `triton.language` first imported with TRITON_INTERPRET=1.  Any earlier import in the
    process — SGLang's, in an in-process SGLang test the worker ran first — decorated them
    compiled, and every interpreted kernel then fails ("Cannot call @triton.jit'd outside
    of the scope of a kernel").  So each test process imports it so first, whatever its
    tests' order; the variable is put back at once (kernels decorate per their module)."""
    import torch

    if torch.cuda.is_available():
        return  # the kernels run compiled on the GPU: so must the helpers
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton.language  # noqa: F401
    finally:
        if saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = saved


def pytest_configure(config: pytest.Config) -> None:
    if getattr(config.option, "dist", "no") != "no" and "PYTEST_XDIST_WORKER" not in os.environ:
        return  # pytest-xdist's controller: it runs no test
    _triton_language_interpreted()


SGLANG_GROUP = "sglang"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that share a costly session- or module-scoped fixture (real SGLang processes,
    Triton in a child, seeded race trials) run on one pytest-xdist worker: every worker
    that runs one of them computes the fixture again.  `shared_fixture` keeps its module
    on one worker.

    Every test marked `sglang` is one group: tests/sglang's session fixtures (SGLang in
    child processes), and the in-process SGLang tests, for importing SGLang is such a cost
    too (~8 CPU-s past torch, once per process): one worker pays it, not each worker that
    happens to run one.  That is safe only because no test process depends on what it
    imported first (`_triton_language_interpreted`)."""
    for item in items:
        if item.get_closest_marker("shared_fixture") is not None:
            group = item.module.__name__
        elif item.get_closest_marker("sglang") is not None:
            group = SGLANG_GROUP
        else:
            continue
        item.add_marker(pytest.mark.xdist_group(group))


class ScriptedServerThread:
    """The scripted server on its own loop and thread: the CLI runs its own asyncio.run."""

    def __init__(self, **kwargs) -> None:
        self.server = ScriptedCompletionServer(**kwargs)
        self.loop = asyncio.new_event_loop()
        started = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(self.loop)
            self.url = self.loop.run_until_complete(self.server.start())
            started.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        assert started.wait(10)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def server_thread() -> Iterator[Callable[..., ScriptedServerThread]]:
    """server_thread(**ScriptedCompletionServer kwargs) → a running server (`.url`), stopped
    at teardown; for code under test that runs its own event loop (a CLI, a subprocess)."""
    made = []

    def start(**kwargs) -> ScriptedServerThread:
        made.append(ScriptedServerThread(**kwargs))
        return made[-1]

    yield start
    for s in made:
        s.close()
