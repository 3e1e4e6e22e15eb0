"""From counts to PASS / FAIL / INCONCLUSIVE, with the reasons a human needs.

Never PASS by default: PASS needs a judged sample count large enough for the exact upper
bound to clear the threshold and the target concurrency actually reached.  The bounds count
failures: corrupt answers and requests that got no answer alike (a user of the canary gets
neither).  FAIL needs only evidence of failures (the sequential rule in `stats`): a run that
shows them fails even if it was otherwise too small.
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
    """Samples counted, failed requests included."""
    corrupt: int
    transport_errors: int
    """Failed requests (no answer to judge); failures beside the corrupt answers."""
    fail_at: int | None
    """Judged-sample count at which the sequential FAIL rule fired, if it did."""
    peak_concurrency: int
    target_concurrency: int
    threshold: float
    confidence: float
    applicable_probes: int


def decide(ev: Evidence) -> tuple[Verdict, tuple[str, ...]]:
    failed = ev.corrupt + ev.transport_errors
    bound = upper_bound(failed, ev.judged, ev.confidence)
    shown, budget = percents(bound, ev.threshold)
    counted = f"{failed}/{ev.judged} failed: {ev.corrupt} corrupt, {ev.transport_errors} requests without an answer"
    if ev.fail_at is not None:
        return Verdict.FAIL, (
            f"failures above {ev.threshold:.3%} at {ev.confidence:.0%} confidence after "
            f"{ev.fail_at} judged samples ({counted})",
        )
    reasons = []
    if ev.applicable_probes == 0:
        reasons.append("no probe of the set applies to this engine")
    if ev.peak_concurrency < ev.target_concurrency:
        reasons.append(
            f"reached {ev.peak_concurrency} requests in flight, target {ev.target_concurrency}"
        )
    if bound >= ev.threshold:
        needed = samples_to_pass(ev.threshold, ev.confidence, failed)
        reasons.append(
            f"upper bound {shown} is not below {budget}: {ev.judged} judged "
            f"samples, {needed} needed with {failed} failed ({counted})"
        )
    if reasons:
        return Verdict.INCONCLUSIVE, tuple(reasons)
    return Verdict.PASS, (
        f"upper bound {shown} < {budget} at {ev.confidence:.0%} confidence ({counted})",
    )
