"""Probe reports live in ConfigMaps: written once per probe attempt, read back as evidence.

The ConfigMap is the durable half of a probe run.  Its name is derived from the rollout
(target, flags revision, attempt), so after an operator restart the reconciler finds the
verdict of an attempt that finished while it was down instead of losing it.  An attempt with
no report and no probe running is run again; a probe Job that ended without filing one is
recorded as INCONCLUSIVE instead (see `job_executor`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from dsv4_engine.probe import ProbeConnectionError, ProbeResult, ProbeSettings, build_report
from dsv4_engine.probe.stats import percents, upper_bound
from dsv4_engine.probe.verdict import Verdict, unexercised
from dsv4_operator.api.rollout import CanarySpec, RolloutVerdict
from dsv4_operator.render.meta import (
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    REPORT_COMPONENT,
    Owner,
    metadata,
)
from dsv4_operator.rollout.decide import ProbeOutcome

log = logging.getLogger("dsv4_operator.rollout")

REPORT_KEY = "report.json"
OUTCOME_KEY = "outcome.json"
COMPONENT = REPORT_COMPONENT
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
            threshold=result.settings.max_corruption_rate,
            exercised=result.tally.exercised,
            kv_canary_violations=_violations(result),
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
        return cls._without_samples(
            RolloutVerdict.INCONCLUSIVE, report, base_url, message, requests
        )

    @classmethod
    def failed(cls, report: str, base_url: str, message: str) -> Evidence:
        """An attempt that FAILs without a probe run (something else took its place)."""
        return cls._without_samples(RolloutVerdict.FAIL, report, base_url, message, None)

    @classmethod
    def _without_samples(
        cls,
        verdict: RolloutVerdict,
        report: str,
        base_url: str,
        message: str,
        requests: dict[str, int] | None,
    ) -> Evidence:
        body = {"verdict": verdict.value, "reasons": [message], "base_url": base_url}
        outcome = ProbeOutcome(verdict, None, None, 0, report, message)
        return cls(body, outcome, requests or {})


def _violations(result: ProbeResult) -> int | None:
    """The kv-canary violations a run counted; None when it did not read them."""
    kv = result.kv_canary
    if kv is None or kv.unread is not None:
        return None
    return sum(v.count for v in kv.violations)


# Canary reports kept per DSV4Deployment: the evidence of the latest rollouts, bounded.
REPORTS_KEPT = 10
# The field manager a probe files its verdict under.  A name the client picks, so it proves
# nothing and nothing trusts it: who wrote a verdict is checked at admission, from the
# identity the API server authenticated (fence.yaml, dsv4-report-fence).
PROBE_MANAGER = "dsv4-probe"
LABEL_TARGET = "inference.dsv4.dev/probe-target"
ANNOTATION_REVISION = "inference.dsv4.dev/revision"
ANNOTATION_ATTEMPT = "inference.dsv4.dev/attempt"
# The Job whose pods alone may file the report's verdict (dsv4-report-fence reads it).
ANNOTATION_PROBE_JOB = "inference.dsv4.dev/probe-job"
MAX_JOB_NAME = 63  # a Job's name is also a label value on its pods


@dataclass(frozen=True)
class ReportRef:
    """Which probe run a report is: a canary attempt, or a production watch run."""

    target: str  # "canary" | "stable"
    revision: str  # the flags probed
    attempt: int = 0  # canary: the attempt number (`status.rollout.probeAttempt`)
    started: str = ""  # stable: when the watch run started (RFC 3339)

    def name(self, owner: Owner) -> str:
        if self.target == "canary":
            return f"{owner.name}-canary-{self.revision}-{self.attempt}"
        started = self.started.replace(":", "").replace("-", "").lower()
        return f"{owner.name}-stable-{self.revision}-{started}"

    def job(self, owner: Owner) -> str:
        """The name of the probe Job that runs this attempt (`job_name`)."""
        return job_name(self.name(owner))


def job_name(report: str) -> str:
    """The probe Job of the report ``report``: the report's own name when it fits, else a
    prefix of it plus a hash of the whole."""
    if len(report) <= MAX_JOB_NAME:
        return report
    digest = hashlib.sha256(report.encode()).hexdigest()[:10]
    return f"{report[: MAX_JOB_NAME - len(digest) - 1].rstrip('-')}-{digest}"


def report_selector(owner: Owner) -> str:
    return f"{LABEL_INSTANCE}={owner.name},{LABEL_COMPONENT}={COMPONENT}"


@dataclass(frozen=True)
class Trust:
    """What a filed verdict is checked against before anything acts on it: the report must
    be the one the operator created for ``owner`` (`foreign_report`: else it FAILs, as
    evidence that existed before the run), and a PASS must hold up (`checked`) against
    ``canary``, the host-tier reads ``hicache`` says its revision asks for, and whether the
    probe Job that filed it completed (``completed``, by report name)."""

    owner: Owner
    canary: CanarySpec
    hicache: Callable[[str], bool] = lambda revision: True
    completed: Callable[[str], bool | None] = lambda report: None

    def outcome(self, config_map: dict[str, Any]) -> ProbeOutcome | None:
        """The verdict ``config_map`` holds, as a rollout may act on it; None: none yet."""
        outcome = owned_outcome(config_map, self.owner)
        if outcome is None or outcome.verdict is not RolloutVerdict.PASS:
            return outcome
        meta = config_map["metadata"]
        revision = (meta.get("annotations") or {}).get(ANNOTATION_REVISION, "")
        return checked(outcome, self.canary, self.completed(meta["name"]), self.hicache(revision))


def owned_outcome(config_map: dict[str, Any], owner: Owner) -> ProbeOutcome | None:
    """The verdict a report of ``owner`` holds (None: none yet), or FAIL where it is not
    the operator's report (`foreign_report`): evidence that existed before the run."""
    why = foreign_report(config_map, owner)
    if why is not None:
        return existed_before(config_map["metadata"]["name"], why)
    return outcome_from_config_map(config_map)


@dataclass(frozen=True)
class FiledReport:
    """A report ConfigMap as read back: what it is about and what it found (if anything)."""

    name: str
    target: str
    revision: str
    attempt: int
    created: str
    outcome: ProbeOutcome | None

    @classmethod
    def of(cls, config_map: dict[str, Any], trust: Trust | None = None) -> FiledReport:
        """The report as filed; with ``trust``, its verdict as every path that acts on it
        must read it (`Trust.outcome`)."""
        meta = config_map["metadata"]
        annotations = meta.get("annotations") or {}
        filed = outcome_from_config_map(config_map)
        outcome = trust.outcome(config_map) if trust is not None and filed else filed
        attempt = annotations.get(ANNOTATION_ATTEMPT, "0")
        return cls(
            name=meta["name"],
            target=(meta.get("labels") or {}).get(LABEL_TARGET, ""),
            revision=annotations.get(ANNOTATION_REVISION, ""),
            attempt=int(attempt) if attempt.isdigit() else 0,
            created=meta.get("creationTimestamp", ""),
            outcome=outcome,
        )


def stale_canary_reports(reports: list[FiledReport], keep: int = REPORTS_KEPT) -> list[str]:
    """Canary reports beyond the ``keep`` newest, oldest first (their probe Jobs go with
    them).  Every attempt files one, so without this they would pile up forever."""
    canary = sorted(
        ((r.created, r.attempt, r.name) for r in reports if r.target == "canary"), reverse=True
    )
    return [name for _, _, name in reversed(canary[keep:])]


def report_skeleton(owner: Owner, ref: ReportRef) -> dict[str, Any]:
    """The report ConfigMap before its probe has run: owned by the resource, no data yet.

    The operator creates it (a plain create, never over what exists: `foreign_report`)
    before the attempt's Job, which is owned by it and fills it in (`report_filing`): the
    fences (fence.yaml) let only the pods of the Job it names (`ANNOTATION_PROBE_JOB`) file
    a verdict into it, and only while it holds none.  Target, revision and attempt ride
    along so a lost `status.rollout` can be rebuilt from reports.
    """
    meta = metadata(owner, ref.name(owner), COMPONENT)
    meta["labels"][LABEL_TARGET] = ref.target
    meta["annotations"] = {
        ANNOTATION_REVISION: ref.revision,
        ANNOTATION_ATTEMPT: str(ref.attempt),
        ANNOTATION_PROBE_JOB: ref.job(owner),
    }
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}


def foreign_report(config_map: dict[str, Any], owner: Owner) -> str | None:
    """Why ``config_map``, read where one of ``owner``'s reports goes, is not a report the
    operator created (`report_skeleton`: its labels, the Job it names, the resource as its
    controlling owner), or None when it is.

    Only the operator may create a ConfigMap labelled as a report (fence.yaml,
    dsv4-report-fence), so one that is not the operator's was put there by someone else,
    before the operator could create its own: whatever it says is evidence that existed
    before the run, and the attempt FAILs on it (`existed_before`)."""
    meta = config_map["metadata"]
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    want = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_INSTANCE: owner.name, LABEL_COMPONENT: COMPONENT}
    wrong = sorted(k for k, v in want.items() if labels.get(k) != v)
    if labels.get(LABEL_TARGET) not in ("canary", "stable"):
        wrong.append(LABEL_TARGET)
    if annotations.get(ANNOTATION_PROBE_JOB) != job_name(meta["name"]):
        wrong.append(ANNOTATION_PROBE_JOB)
    if wrong:
        return f"its {', '.join(wrong)} are not what the operator sets"
    controllers = [r.get("uid") for r in meta.get("ownerReferences") or [] if r.get("controller")]
    if controllers != [owner.uid]:
        return f"it is not controlled by DSV4Deployment {owner.name} (uid {owner.uid})"
    return None


def existed_before(report: str, why: str) -> ProbeOutcome:
    """The verdict of an attempt whose report ConfigMap someone else made: FAIL."""
    message = (
        f"evidence existed before the run: ConfigMap {report} is not the report the operator "
        f"created for this attempt ({why}); nothing in it is trusted"
    )
    log.warning("report %s: %s", report, message)
    return ProbeOutcome(RolloutVerdict.FAIL, None, None, 0, report, message)


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
                    "threshold": outcome.threshold,
                    "samples": outcome.samples,
                    "exercised": outcome.exercised,
                    "kv_canary_violations": outcome.kv_canary_violations,
                    "message": outcome.message,
                    "requests": evidence.requests,
                }
            ),
        },
    }


def report_config_map(owner: Owner, ref: ReportRef, evidence: Evidence) -> dict[str, Any]:
    """The whole report ConfigMap, skeleton and filing in one (an attempt that ended
    without running a probe, recorded by the operator)."""
    config_map = report_skeleton(owner, ref)
    filing = report_filing(evidence)
    config_map["metadata"]["annotations"].update(filing["metadata"]["annotations"])
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
            threshold=raw.get("threshold"),  # absent in reports filed before it was recorded
            exercised=raw.get("exercised"),  # absent in reports filed before it was counted
            kv_canary_violations=raw.get("kv_canary_violations"),  # ... before it was read
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


def distrust_pass(
    outcome: ProbeOutcome,
    needed: int,
    threshold: float,
    confidence: float,
    completed: bool | None,
    hicache: bool,
) -> str | None:
    """Why a PASS read from a report must not promote anything, or None when it holds.

    The report is re-checked, not believed.  Who filed it is not read from it (a field
    manager is a name the client picks): the fences let only the operator create a report
    and only the pods of the Job it names file its verdict (fence.yaml), the caller checked
    the report is the operator's own (`foreign_report`), and ``completed`` says whether
    that Job — owned by this very report — completed.  Then: its judged samples reach what
    the canary settings require now, its corruption count keeps the exact upper bound below the threshold, with
    ``hicache`` (the revision probed runs it) enough of its samples read a prefix back from
    the host tier — the probe's own rule, `verdict.unexercised`, with a report that does
    not say counting none — its engines' kv-canary (every canary runs it:
    `slices.canary_spec`) was read and counted no violation, and (``completed`` not None: a
    probe Job) the probe run itself ended with exit 0."""
    if outcome.samples < needed:
        return f"{outcome.samples} judged samples, {needed} required by spec.canary"
    bound = upper_bound(outcome.corrupt, outcome.samples, confidence)
    if bound >= threshold:
        shown, budget = percents(bound, threshold)
        return (
            f"{outcome.corrupt}/{outcome.samples} corrupt bounds the rate at {shown}, "
            f"not below maxCorruptionRate {budget}"
        )
    exercised = outcome.exercised or 0
    if (why := unexercised(hicache, exercised, outcome.samples, confidence)) is not None:
        return why
    if outcome.kv_canary_violations is None:
        return "it does not show the canary engines' kv-canary violations read"
    if outcome.kv_canary_violations:
        return f"its engines counted {outcome.kv_canary_violations} kv-canary violations"
    if completed is False:
        return "its probe Job did not complete with exit code 0"
    return None


def checked(
    outcome: ProbeOutcome,
    canary: CanarySpec,
    completed: bool | None,
    hicache: bool,
) -> ProbeOutcome:
    """``outcome`` as a promotion may act on it: a PASS that does not hold up against
    ``canary`` and, ``hicache``, the host-tier reads its revision asks for (`distrust_pass`)
    is INCONCLUSIVE, saying why; any other verdict as filed."""
    if outcome.verdict is not RolloutVerdict.PASS:
        return outcome
    why = distrust_pass(
        outcome,
        canary.sample_count,
        canary.max_corruption_rate,
        canary.confidence,
        completed,
        hicache,
    )
    return outcome if why is None else untrusted(outcome, why)


def untrusted(outcome: ProbeOutcome, why: str) -> ProbeOutcome:
    """A PASS refused: INCONCLUSIVE, and the message says which report and why."""
    log.warning("report %s says PASS but is not trusted: %s", outcome.report, why)
    return replace(
        outcome,
        verdict=RolloutVerdict.INCONCLUSIVE,
        message=f"the PASS in report {outcome.report} was not trusted: {why}",
    )
