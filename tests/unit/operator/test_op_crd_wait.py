"""Limited to namespaces, the operator starts kopf only once the API serves its CRD: kopf
finds CRDs only as it starts, so an operator started first would watch nothing, ever.

The waiting is tested here against a stand-in for the API's discovery.  On the real path:
tests/e2e/test_operator_lifecycle.py starts its namespaced operator before the CRD is served
(its `operator` fixture: unready, the log naming the CRD, then serving it once applied), and
tests/e2e/test_namespaced_install.py::test_the_operators_token_reads_whether_its_crd_is_served
has the namespaced install's own token read the API's discovery.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from dsv4_operator import runtime
from dsv4_operator.api import GROUP, PLURAL, VERSION
from dsv4_operator.kube.client import ApiError


class Discovery:
    """Stands in for `Kube`, discovery only: answers in turn, the last one for good."""

    def __init__(self, *answers: bool | ApiError) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[str, str, str]] = []

    def serves(self, group: str, version: str, plural: str) -> bool:
        self.asked.append((group, version, plural))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, ApiError):
            raise answer
        return answer


def wait(kube: Discovery, stopped: asyncio.Event | None = None) -> bool:
    async def run() -> bool:
        return await runtime.crd_served(kube, stopped or asyncio.Event(), every=0.01)  # type: ignore[arg-type]

    return asyncio.run(asyncio.wait_for(run(), 10))


def test_it_waits_for_the_crd_saying_once_what_is_missing(caplog: pytest.LogCaptureFixture):
    kube = Discovery(False, False, True)
    with caplog.at_level(logging.INFO, logger="dsv4_operator.runtime"):
        assert wait(kube)
    assert kube.asked == [(GROUP, VERSION, PLURAL)] * 3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert f"{PLURAL}.{GROUP} CRD is not served" in warnings[0]
    assert "crds/dsv4deployment.yaml" in warnings[0]
    assert any("is served: starting" in r.getMessage() for r in caplog.records)


def test_served_at_once_it_starts_without_a_word(caplog: pytest.LogCaptureFixture):
    with caplog.at_level(logging.INFO, logger="dsv4_operator.runtime"):
        assert wait(Discovery(True))
    assert not caplog.records


def test_a_discovery_error_is_waited_out_and_named(caplog: pytest.LogCaptureFixture):
    with caplog.at_level(logging.WARNING, logger="dsv4_operator.runtime"):
        assert wait(Discovery(ApiError(503, "Service Unavailable"), True))
    assert "cannot tell" in caplog.records[0].getMessage()
    assert "503" in caplog.records[0].getMessage()


def test_stopped_while_waiting_it_ends_without_starting():
    async def run() -> tuple[bool, int]:
        kube, stopped = Discovery(False), asyncio.Event()
        waiting = asyncio.create_task(runtime.crd_served(kube, stopped, every=30))  # type: ignore[arg-type]
        while not kube.asked:
            await asyncio.sleep(0.01)
        stopped.set()
        return await asyncio.wait_for(waiting, 5), len(kube.asked)

    assert asyncio.run(run()) == (False, 1)
