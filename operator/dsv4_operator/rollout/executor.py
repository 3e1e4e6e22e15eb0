"""Runs probe attempts for the rollout and files their reports as ConfigMaps.

In local mode (this module) an attempt is an asyncio task on the operator's own loop; a
real cluster runs the same `dsv4ctl probe` in a Job with the operator image.  Either way
the report ConfigMap is the only thing the state machine trusts: a task that dies with the
operator leaves no report, and the reconciler simply starts that attempt again.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from dsv4_engine.probe import ProbeConnectionError, ProbeSettings, build_report, run_probes
from dsv4_engine.probe.verdict import Verdict
from dsv4_operator import metrics
from dsv4_operator.api.rollout import RolloutVerdict
from dsv4_operator.render.meta import Owner
from dsv4_operator.rollout.decide import ProbeOutcome
from dsv4_operator.rollout.reports import report_config_map

log = logging.getLogger("dsv4_operator.rollout")

VERDICTS = {
    Verdict.PASS: RolloutVerdict.PASS,
    Verdict.FAIL: RolloutVerdict.FAIL,
    Verdict.INCONCLUSIVE: RolloutVerdict.INCONCLUSIVE,
}


class ProbeExecutor:
    """Thread-safe front of the probe tasks: the reconciler calls it from a worker thread."""

    def __init__(
        self,
        apply: Callable[[dict[str, Any]], Any],
        loop: asyncio.AbstractEventLoop,
        on_done: Callable[[Owner], None] = lambda owner: None,
    ) -> None:
        self._apply = apply
        self._loop = loop
        self._on_done = on_done
        self._running: set[str] = set()

    def running(self, report: str) -> bool:
        return report in self._running

    def start(self, owner: Owner, report: str, target: str, settings: ProbeSettings) -> None:
        if report in self._running:
            return
        self._running.add(report)
        asyncio.run_coroutine_threadsafe(self.run(owner, report, target, settings), self._loop)

    async def run(self, owner: Owner, report: str, target: str, settings: ProbeSettings) -> None:
        """One attempt, start to report; never raises (a failure is an INCONCLUSIVE report)."""
        try:
            body, outcome, outcomes = await _probe(report, settings)
            await asyncio.to_thread(self._apply, report_config_map(owner, report, body, outcome))
            metrics.record_verdict(
                owner.namespace,
                owner.name,
                target,
                outcome.verdict,
                outcome.rate,
                outcome.bound,
                outcomes,
            )
            log.info("probe %s: %s", report, outcome.verdict.value)
        except Exception:  # noqa: BLE001 - the attempt is retried by the next reconcile
            log.exception("probe %s could not file its report; it will be run again", report)
        finally:
            self._running.discard(report)
        self._on_done(owner)


async def _probe(
    report: str, settings: ProbeSettings
) -> tuple[dict[str, Any], ProbeOutcome, dict[str, int]]:
    try:
        result = await run_probes(settings)
    except ProbeConnectionError as err:
        # A canary that cannot be reached gives no evidence: INCONCLUSIVE, never PASS.
        message = f"canary endpoint unreachable: {err}"
        body = {"verdict": "INCONCLUSIVE", "reasons": [message], "base_url": settings.base_url}
        outcome = ProbeOutcome(RolloutVerdict.INCONCLUSIVE, None, None, 0, report, message)
        return body, outcome, {"transport_error": 1}
    outcome = ProbeOutcome(
        verdict=VERDICTS[result.verdict],
        rate=result.rate,
        bound=result.upper_bound,
        samples=result.judged,
        report=report,
        message="; ".join(result.reasons),
    )
    outcomes = Counter(sample.outcome.value for sample in result.tally.samples)
    return build_report(result), outcome, dict(outcomes)
