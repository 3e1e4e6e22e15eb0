"""Runs probe attempts for the rollout and files their reports as ConfigMaps.

Two executors answer the same two questions for the rollout controller — "is the attempt
behind this report still running?" and "run it" — and either way the report ConfigMap is
the only thing the state machine trusts:

* `LocalProbeExecutor` (this module): an asyncio task on the operator's own loop, for the
  local cluster where the operator reaches engines through the local runtime's endpoints.
  A task that dies with the operator leaves no report and the attempt is simply run again.
* `JobProbeExecutor` (`probe_job`): a Kubernetes Job running `dsv4ctl probe` with the
  operator image, as a real cluster does it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable
from typing import Any, Protocol

from dsv4_engine.probe import ProbeConnectionError, ProbeSettings, run_probes
from dsv4_operator import metrics
from dsv4_operator.kube.client import ApiError
from dsv4_operator.render.meta import Owner
from dsv4_operator.rollout.reports import (
    PROBE_MANAGER,
    Evidence,
    ReportRef,
    foreign_report,
    outcome_from_config_map,
    report_filing,
    report_skeleton,
)

log = logging.getLogger("dsv4_operator.rollout")


class ProbeExecutor(Protocol):
    """Called from the reconciler's worker thread; every method must be idempotent."""

    def running(self, owner: Owner, report: str) -> bool:
        """True while the attempt filing ``report`` is still under way."""
        ...

    def start(self, owner: Owner, ref: ReportRef, settings: ProbeSettings) -> None:
        """Run the attempt filing the report ``ref`` names, unless it runs already."""
        ...

    def stop(self, owner: Owner, report: str) -> None:
        """Stop that attempt if it still runs; whatever it filed stays as it is."""
        ...

    def completed(self, owner: Owner, report: str) -> bool | None:
        """Whether the run that filed ``report`` ended cleanly (exit 0), when the executor
        can tell after the fact (a Job can); None when it cannot."""
        ...


def create_report(kube: Any, owner: Owner, ref: ReportRef) -> dict[str, Any] | None:
    """The attempt's report ConfigMap, created now (a plain create: never applied over one
    that exists), or None where one someone else made holds its name.

    One that exists already is used only if it is the operator's own and holds no verdict
    yet: a start interrupted after the create (an operator restart, a failed Job create).
    Anything else — another's, or one with a verdict before the probe ran — is evidence
    that existed before the run: it is left as it is, and the pass reads it as FAIL
    (`reports.owned_outcome`)."""
    try:
        return kube.create(report_skeleton(owner, ref))
    except ApiError as err:
        if err.status != 409:
            raise
    held = kube.get("ConfigMap", owner.namespace, ref.name(owner))
    if held is None:
        raise ApiError(409, f"report {ref.name(owner)} existed, then vanished: try again")
    if foreign_report(held, owner) is None and outcome_from_config_map(held) is None:
        return held
    log.warning("probe %s: its report ConfigMap existed before the run; not probing", held)
    return None


def record(owner: Owner, target: str, evidence: Evidence) -> None:
    outcome = evidence.outcome
    metrics.record_verdict(
        owner.namespace,
        owner.name,
        target,
        outcome.verdict,
        outcome.rate,
        outcome.bound,
        evidence.requests,
    )


class LocalProbeExecutor:
    """Probe tasks on the operator's own event loop.  A task files its report as a probe
    Job does: the skeleton created first (`create_report`), the verdict then applied into
    it, so the operator's checks read both kinds of report the same way.  ``kube``: the
    API client (create, get, apply)."""

    def __init__(
        self,
        kube: Any,
        loop: asyncio.AbstractEventLoop,
        on_done: Callable[[Owner], None] = lambda owner: None,
    ) -> None:
        self._kube = kube
        self._loop = loop
        self._on_done = on_done
        self._running: dict[str, concurrent.futures.Future[None]] = {}
        # Reports whose verdict this process filed.  The passes read reports from the
        # watch-fed cache, which shows a filing a moment after the task ends: in between,
        # an attempt that is neither running nor decided would be run again, and the rerun
        # would overwrite the verdict the rollout already acted on.  A filed attempt counts
        # as under way until its verdict is read, and is never run again.
        self._filed: set[str] = set()

    def running(self, owner: Owner, report: str) -> bool:
        return report in self._running or report in self._filed

    def completed(self, owner: Owner, report: str) -> bool | None:
        return None

    def start(self, owner: Owner, ref: ReportRef, settings: ProbeSettings) -> None:
        report = ref.name(owner)
        if report in self._running or report in self._filed:
            return
        coroutine = self.run(owner, ref, settings)
        self._running[report] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def stop(self, owner: Owner, report: str) -> None:
        self._filed.discard(report)  # the rollout no longer waits for it
        future = self._running.get(report)
        if future is not None:
            future.cancel()  # cancels the task on the loop; its `finally` forgets it

    async def run(self, owner: Owner, ref: ReportRef, settings: ProbeSettings) -> None:
        """One attempt, start to report; never raises (a failure is retried, not lost)."""
        report = ref.name(owner)
        try:
            if await asyncio.to_thread(create_report, self._kube, owner, ref) is not None:
                evidence = await _probe(report, settings)
                filing = report_filing(evidence)
                filing["metadata"].update(name=report, namespace=owner.namespace)
                body = {"apiVersion": "v1", "kind": "ConfigMap", **filing}
                await asyncio.to_thread(self._kube.apply, body, manager=PROBE_MANAGER)
                record(owner, ref.target, evidence)
                log.info("probe %s: %s", report, evidence.outcome.verdict.value)
            # Filed, or never run (another's report there: the pass reads it as FAIL).
            self._filed.add(report)
        except Exception:  # noqa: BLE001 - the attempt is retried by the next reconcile
            log.exception("probe %s could not file its report; it will be run again", report)
        finally:
            self._running.pop(report, None)
        self._on_done(owner)


async def _probe(report: str, settings: ProbeSettings) -> Evidence:
    try:
        return Evidence.of(report, await run_probes(settings))
    except ProbeConnectionError as err:
        return Evidence.unreachable(report, settings, err)
