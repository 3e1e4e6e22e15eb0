"""Fixtures shared by every test folder."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator

import pytest

from dsv4_engine.probe.scripted_server import ScriptedCompletionServer


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that share a costly session- or module-scoped fixture (real SGLang processes,
    Triton in a child, seeded race trials) run on one pytest-xdist worker: every worker
    that runs one of them computes the fixture again.  `shared_fixture("name")` groups
    several modules (tests/sglang's session fixtures); a bare one, its own module.

    Only fixtures computed out of process belong here: a group is scheduled as one block,
    so a module that imports Triton compiled would then run before the in-process Triton
    interpreter tests of its worker (tests/unit/engine/hicache), which need it first."""
    for item in items:
        marker = item.get_closest_marker("shared_fixture")
        if marker is not None:
            group = marker.args[0] if marker.args else item.module.__name__
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
