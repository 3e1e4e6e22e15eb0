"""Probe reports live in ConfigMaps: written once per probe attempt, read back as evidence.

The ConfigMap is the durable half of a probe run.  Its name is derived from the rollout
(target, flags revision, attempt), so after an operator restart the reconciler finds the
verdict of an attempt that finished while it was down instead of losing it, and an attempt
whose report is absent is simply run again.
"""

from __future__ import annotations

import json
from typing import Any

from dsv4_operator.api.rollout import RolloutVerdict
from dsv4_operator.render.meta import LABEL_MANAGED_BY, Owner, metadata
from dsv4_operator.rollout.decide import ProbeOutcome

REPORT_KEY = "report.json"
COMPONENT = "rollout-report"


def report_name(owner: Owner, target: str, revision: str, attempt: int) -> str:
    return f"{owner.name}-{target}-{revision}-{attempt}"


def report_config_map(
    owner: Owner, name: str, report: dict[str, Any], outcome: ProbeOutcome
) -> dict[str, Any]:
    meta = metadata(owner, name, COMPONENT)
    # Not labelled managed-by: the children reconcile lists by that label and would delete a
    # report as an orphan.  The owner reference still garbage-collects it with the resource.
    meta["labels"] = {k: v for k, v in meta["labels"].items() if k != LABEL_MANAGED_BY}
    meta["annotations"] = {
        "inference.dsv4.dev/verdict": outcome.verdict.value,
        "inference.dsv4.dev/samples": str(outcome.samples),
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta,
        "data": {
            REPORT_KEY: json.dumps(report, indent=1, sort_keys=True),
            "outcome.json": json.dumps(
                {
                    "verdict": outcome.verdict.value,
                    "rate": outcome.rate,
                    "bound": outcome.bound,
                    "samples": outcome.samples,
                    "message": outcome.message,
                }
            ),
        },
    }


def outcome_from_config_map(config_map: dict[str, Any]) -> ProbeOutcome | None:
    """The verdict a report ConfigMap records; None when it is not (yet) a complete report."""
    try:
        raw = json.loads(config_map["data"]["outcome.json"])
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
