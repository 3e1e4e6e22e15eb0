"""Probe reports live in ConfigMaps: written once per probe attempt, read back as evidence.

The ConfigMap is the durable half of a probe run.  Its name is derived from the rollout
(target, flags revision, attempt), so after an operator restart the reconciler finds the
verdict of an attempt that finished while it was down instead of losing it.  An attempt with
no report and no probe running is run again; a probe Job that ended without filing one is
recorded as INCONCLUSIVE instead (see `job_executor`).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from dsv4_engine.probe import ProbeConnectionError, ProbeResult, ProbeSettings, build_report
from dsv4_engine.probe.verdict import Verdict
from dsv4_operator.api.rollout import RolloutVerdict
from dsv4_operator.render.meta import LABEL_COMPONENT, LABEL_INSTANCE, Owner, metadata
from dsv4_operator.rollout.decide import ProbeOutcome

REPORT_KEY = "report.json"
OUTCOME_KEY = "outcome.json"
COMPONENT = "rollout-report"
ANNOTATION_VERDICT = "inference.dsv4.dev/verdict"
ANNOTATION_SAMPLES = "inference.dsv4.dev/samples"
VERDICTS = {
    Verdict.PASS: RolloutVerdict.PASS,
    Verdict.FAIL: RolloutVerdict.FAIL,
    Verdict.INCONCLUSIVE: RolloutVerdict.INCONCLUSIVE,
}


@dataclass(frozen=True)
class Evidence:
    """What one probe attempt found, in the three shapes its readers need: the JSON report
    (people), the outcome (the state machine) and the requests by outcome (metrics)."""

    body: dict[str, Any]
    outcome: ProbeOutcome
    requests: dict[str, int]

    @classmethod
    def of(cls, report: str, result: ProbeResult) -> Evidence:
        outcome = ProbeOutcome(
            verdict=VERDICTS[result.verdict],
            rate=result.rate,
            bound=result.upper_bound,
            samples=result.judged,
            report=report,
            message="; ".join(result.reasons),
        )
        outcomes = Counter(sample.outcome.value for sample in result.tally.samples)
        return cls(build_report(result), outcome, dict(outcomes))

    @classmethod
    def unreachable(
        cls, report: str, settings: ProbeSettings, err: ProbeConnectionError
    ) -> Evidence:
        """A canary that cannot be reached gives no evidence: INCONCLUSIVE, never PASS."""
        message = f"canary endpoint unreachable: {err}"
        return cls.inconclusive(report, settings.base_url, message, {"transport_error": 1})

    @classmethod
    def inconclusive(
        cls, report: str, base_url: str, message: str, requests: dict[str, int] | None = None
    ) -> Evidence:
        """No probe result to show, only why (the report then has no samples)."""
        body = {"verdict": "INCONCLUSIVE", "reasons": [message], "base_url": base_url}
        outcome = ProbeOutcome(RolloutVerdict.INCONCLUSIVE, None, None, 0, report, message)
        return cls(body, outcome, requests or {})


# Canary reports kept per DSV4Deployment: the evidence of the latest rollouts, bounded.
REPORTS_KEPT = 10


def report_name(owner: Owner, target: str, revision: str, attempt: int) -> str:
    return f"{owner.name}-{target}-{revision}-{attempt}"


def report_selector(owner: Owner) -> str:
    return f"{LABEL_INSTANCE}={owner.name},{LABEL_COMPONENT}={COMPONENT}"


def stale_canary_reports(
    owner: Owner, config_maps: list[dict[str, Any]], keep: int = REPORTS_KEPT
) -> list[str]:
    """Canary reports beyond the ``keep`` newest, oldest first (their probe Jobs go with
    them).  Every attempt files one, so without this they would pile up forever."""
    prefix = f"{owner.name}-canary-"
    reports = sorted(
        (
            (cm["metadata"].get("creationTimestamp", ""), cm["metadata"]["name"])
            for cm in config_maps
            if cm["metadata"]["name"].startswith(prefix)
        ),
        reverse=True,
    )
    return [name for _, name in reversed(reports[keep:])]


def report_skeleton(owner: Owner, name: str) -> dict[str, Any]:
    """The report ConfigMap before its probe has run: owned by the resource, no data yet.

    A probe Job fills it in (`report_filing`); the operator creates it first so that the
    Job needs no say over ownership and only `get`/`patch` on ConfigMaps.
    """
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(owner, name, COMPONENT, managed=False),
    }


def report_filing(evidence: Evidence) -> dict[str, Any]:
    """The part of a report ConfigMap a probe writes: verdict annotations and the data."""
    outcome = evidence.outcome
    return {
        "metadata": {
            "annotations": {
                ANNOTATION_VERDICT: outcome.verdict.value,
                ANNOTATION_SAMPLES: str(outcome.samples),
            }
        },
        "data": {
            REPORT_KEY: json.dumps(evidence.body, indent=1, sort_keys=True),
            OUTCOME_KEY: json.dumps(
                {
                    "verdict": outcome.verdict.value,
                    "rate": outcome.rate,
                    "bound": outcome.bound,
                    "samples": outcome.samples,
                    "message": outcome.message,
                    "requests": evidence.requests,
                }
            ),
        },
    }


def report_config_map(owner: Owner, name: str, evidence: Evidence) -> dict[str, Any]:
    """The whole report ConfigMap, as a probe running inside the operator files it."""
    config_map = report_skeleton(owner, name)
    filing = report_filing(evidence)
    config_map["metadata"]["annotations"] = filing["metadata"]["annotations"]
    config_map["data"] = filing["data"]
    return config_map


def outcome_from_config_map(config_map: dict[str, Any]) -> ProbeOutcome | None:
    """The verdict a report ConfigMap records; None when it is not (yet) a complete report."""
    raw = _raw_outcome(config_map)
    try:
        return ProbeOutcome(
            verdict=RolloutVerdict(raw["verdict"]),
            rate=raw["rate"],
            bound=raw["bound"],
            samples=int(raw["samples"]),
            report=config_map["metadata"]["name"],
            message=raw.get("message", ""),
        )
    except (KeyError, TypeError, ValueError):
        return None


def requests_from_config_map(config_map: dict[str, Any]) -> dict[str, int]:
    """The probe requests by outcome a report records (for metrics); {} when absent."""
    requests = _raw_outcome(config_map).get("requests")
    return {str(k): int(v) for k, v in requests.items()} if isinstance(requests, dict) else {}


def _raw_outcome(config_map: dict[str, Any]) -> dict[str, Any]:
    try:
        raw = json.loads((config_map.get("data") or {})[OUTCOME_KEY])
    except (KeyError, TypeError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}
