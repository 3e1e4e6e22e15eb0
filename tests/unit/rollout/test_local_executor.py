"""The local probe executor (in-process probes, the development launcher's) never runs an
attempt twice: the passes read reports from the watch-fed cache, which shows a filed
verdict a moment after the probe task ends.  Seen in the README tour: a PASS, promoted, then
the same attempt re-run against the canary being torn down, whose INCONCLUSIVE overwrote
the report the promotion rested on."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dsv4_engine.probe import ProbeSettings
from dsv4_operator.render.meta import Owner
from dsv4_operator.rollout import executor as executor_module
from dsv4_operator.rollout.executor import LocalProbeExecutor
from dsv4_operator.rollout.reports import Evidence, ReportRef

OWNER = Owner(name="flash", namespace="ns", uid="uid-1")
REF = ReportRef("canary", "rev", attempt=1)
SETTINGS = ProbeSettings(base_url="http://router:8000")


@pytest.fixture
def probes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    ran: list[str] = []

    async def probe(report: str, settings: ProbeSettings) -> Evidence:
        ran.append(report)
        return Evidence.inconclusive(report, settings.base_url, "a verdict")

    monkeypatch.setattr(executor_module, "_probe", probe)
    return ran


def executor(apply: Any, done: asyncio.Event) -> LocalProbeExecutor:
    return LocalProbeExecutor(apply, asyncio.get_running_loop(), on_done=lambda _: done.set())


@pytest.mark.asyncio
async def test_a_filed_attempt_counts_as_running_and_is_never_run_again(probes):
    filed: list[dict[str, Any]] = []
    done = asyncio.Event()
    local = executor(lambda body, **_: filed.append(body), done)
    local.start(OWNER, REF, SETTINGS)
    await asyncio.wait_for(done.wait(), 30)
    report = REF.name(OWNER)
    assert probes == [report] and len(filed) == 2  # the skeleton, then the verdict
    # The cache has not shown the verdict yet: the attempt is still "under way" for decide,
    # and the START_PROBE it would otherwise ask for starts nothing.
    assert local.running(OWNER, report)
    local.start(OWNER, REF, SETTINGS)
    assert not local.running(OWNER, "another-report")
    await asyncio.sleep(0)
    assert probes == [report] and len(filed) == 2
    # Once the rollout stops waiting for it, it is forgotten.
    local.stop(OWNER, report)
    assert not local.running(OWNER, report)


@pytest.mark.asyncio
async def test_an_attempt_that_could_not_file_its_verdict_is_run_again(probes):
    calls: list[str] = []
    done = asyncio.Event()

    def apply(body: dict[str, Any], **manager: Any) -> None:
        calls.append(body["metadata"]["name"])
        if manager:  # the verdict, under the probe's field manager
            raise RuntimeError("API server unavailable")

    local = executor(apply, done)
    local.start(OWNER, REF, SETTINGS)
    await asyncio.wait_for(done.wait(), 30)
    report = REF.name(OWNER)
    assert not local.running(OWNER, report)  # nothing filed: decide runs it again
    done.clear()
    local.start(OWNER, REF, SETTINGS)
    await asyncio.wait_for(done.wait(), 30)
    assert probes == [report, report]
