"""From counts to PASS / FAIL / INCONCLUSIVE, with the reasons a human needs.

Never PASS by default: PASS needs a judged sample count large enough for the exact upper
bound to clear the threshold, transport errors within their limit, and the target
concurrency actually reached.  FAIL needs only evidence of corruption (the sequential rule
in `stats`): a run that shows corruption fails even if it was otherwise too small.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from dsv4_engine.probe.stats import percents, samples_to_pass, upper_bound


class Verdict(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"

    @property
    def exit_code(self) -> int:
        return {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 2}[self.value]


@dataclass(frozen=True)
class Evidence:
    judged: int
    corrupt: int
    transport_errors: int
    fail_at: int | None
    """Judged-sample count at which the sequential FAIL rule fired, if it did."""
    peak_concurrency: int
    target_concurrency: int
    threshold: float
    confidence: float
    max_transport_error_rate: float
    applicable_probes: int


def decide(ev: Evidence) -> tuple[Verdict, tuple[str, ...]]:
    bound = upper_bound(ev.corrupt, ev.judged, ev.confidence)
    shown, budget = percents(bound, ev.threshold)
    if ev.fail_at is not None:
        return Verdict.FAIL, (
            f"corruption above {ev.threshold:.3%} at {ev.confidence:.0%} confidence after "
            f"{ev.fail_at} judged samples ({ev.corrupt}/{ev.judged} corrupt in total)",
        )
    reasons = []
    if ev.applicable_probes == 0:
        reasons.append("no probe of the set applies to this engine")
    attempted = ev.judged + ev.transport_errors
    if attempted and ev.transport_errors / attempted > ev.max_transport_error_rate:
        reasons.append(
            f"{ev.transport_errors}/{attempted} requests got no answer "
            f"(limit {ev.max_transport_error_rate:.1%})"
        )
    if ev.peak_concurrency < ev.target_concurrency:
        reasons.append(
            f"reached {ev.peak_concurrency} requests in flight, target {ev.target_concurrency}"
        )
    if bound >= ev.threshold:
        needed = samples_to_pass(ev.threshold, ev.confidence, ev.corrupt)
        reasons.append(
            f"upper bound {shown} is not below {budget}: {ev.judged} judged "
            f"samples, {needed} needed with {ev.corrupt} corrupt"
        )
    if reasons:
        return Verdict.INCONCLUSIVE, tuple(reasons)
    return Verdict.PASS, (
        f"upper bound {shown} < {budget} at {ev.confidence:.0%} confidence "
        f"({ev.corrupt}/{ev.judged} corrupt)",
    )
