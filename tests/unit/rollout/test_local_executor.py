"""The local probe executor (in-process probes, the development launcher's) never runs an
attempt twice: the passes read reports from the watch-fed cache, which shows a filed
verdict a moment after the probe task ends.  Seen in the README tour: a PASS, promoted, then
the same attempt re-run against the canary being torn down, whose INCONCLUSIVE overwrote
the report the promotion rested on.  Like a probe Job, it creates the report first and
never probes into one someone else made."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dsv4_engine.probe import ProbeSettings
from dsv4_operator.kube.client import ApiError
from dsv4_operator.render.meta import Owner
from dsv4_operator.rollout import executor as executor_module
from dsv4_operator.rollout.executor import LocalProbeExecutor
from dsv4_operator.rollout.reports import Evidence, ReportRef, owned_outcome

OWNER = Owner(name="flash", namespace="ns", uid="uid-1")
REF = ReportRef("canary", "rev", attempt=1)
SETTINGS = ProbeSettings(base_url="http://router:8000")


class Reports:
    """ConfigMaps by name, written as the API server would: a create of a name that exists
    is a 409; an apply merges.  ``failing_filings``: applies that fail first."""

    def __init__(self, failing_filings: int = 0) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.writes: list[str] = []
        self.failing_filings = failing_filings

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        name = obj["metadata"]["name"]
        if name in self.objects:
            raise ApiError(409, f"configmaps {name!r} already exists")
        self.writes.append("create")
        self.objects[name] = {**obj, "metadata": {**obj["metadata"], "uid": f"uid-{name}"}}
        return self.objects[name]

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objects.get(name)

    def apply(self, body: dict[str, Any], **manager: Any) -> None:
        self.writes.append("apply")
        if self.failing_filings:
            self.failing_filings -= 1
            raise RuntimeError("API server unavailable")
        held = self.objects[body["metadata"]["name"]]
        held["metadata"].setdefault("annotations", {}).update(body["metadata"]["annotations"])
        held["data"] = body["data"]


@pytest.fixture
def probes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    ran: list[str] = []

    async def probe(report: str, settings: ProbeSettings) -> Evidence:
        ran.append(report)
        return Evidence.inconclusive(report, settings.base_url, "a verdict")

    monkeypatch.setattr(executor_module, "_probe", probe)
    return ran


def executor(kube: Reports, done: asyncio.Event) -> LocalProbeExecutor:
    return LocalProbeExecutor(kube, asyncio.get_running_loop(), on_done=lambda _: done.set())


@pytest.mark.asyncio
async def test_a_filed_attempt_counts_as_running_and_is_never_run_again(probes):
    kube = Reports()
    done = asyncio.Event()
    local = executor(kube, done)
    local.start(OWNER, REF, SETTINGS)
    await asyncio.wait_for(done.wait(), 30)
    report = REF.name(OWNER)
    assert probes == [report] and kube.writes == ["create", "apply"]  # skeleton, verdict
    # The cache has not shown the verdict yet: the attempt is still "under way" for decide,
    # and the START_PROBE it would otherwise ask for starts nothing.
    assert local.running(OWNER, report)
    local.start(OWNER, REF, SETTINGS)
    assert not local.running(OWNER, "another-report")
    await asyncio.sleep(0)
    assert probes == [report] and kube.writes == ["create", "apply"]
    # Once the rollout stops waiting for it, it is forgotten.
    local.stop(OWNER, report)
    assert not local.running(OWNER, report)


@pytest.mark.asyncio
async def test_an_attempt_that_could_not_file_its_verdict_is_run_again(probes):
    kube = Reports(failing_filings=1)
    done = asyncio.Event()
    local = executor(kube, done)
    local.start(OWNER, REF, SETTINGS)
    await asyncio.wait_for(done.wait(), 30)
    report = REF.name(OWNER)
    assert not local.running(OWNER, report)  # nothing filed: decide runs it again
    done.clear()
    local.start(OWNER, REF, SETTINGS)
    await asyncio.wait_for(done.wait(), 30)
    # Its own unfiled report, found again: used as it is, not created over.
    assert probes == [report, report] and kube.writes == ["create", "apply", "apply"]


@pytest.mark.asyncio
async def test_a_report_someone_else_made_is_never_probed_into(probes):
    """A ConfigMap at the attempt's report name before the operator created one: nothing
    probes or writes into it, and the pass reads it as FAIL."""
    kube = Reports()
    report = REF.name(OWNER)
    kube.objects[report] = {"metadata": {"name": report, "namespace": "ns", "uid": "theirs"}}
    done = asyncio.Event()
    local = executor(kube, done)
    local.start(OWNER, REF, SETTINGS)
    await asyncio.wait_for(done.wait(), 30)
    assert probes == [] and kube.writes == []
    assert local.running(OWNER, report)  # never run again either
    assert owned_outcome(kube.objects[report], OWNER).message.startswith(
        "evidence existed before the run"
    )
