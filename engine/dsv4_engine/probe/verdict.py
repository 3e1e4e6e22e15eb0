"""From counts to PASS / FAIL / INCONCLUSIVE, with the reasons a human needs.

Never PASS by default: PASS needs a judged sample count large enough for the exact upper
bound to clear the threshold, the target concurrency actually reached and, when the engine
runs HiCache, enough samples proven to have read a prefix back from the host tier
(`unexercised`; the proof is the engines' own count of host-tier reads:
`dsv4_engine.probe.evidence`): a run that never took the changed path proves nothing
about it, and one whose host-tier reads could not be read proves nothing either.  The bounds count
failures: corrupt answers and requests that got no answer alike (a user of the canary gets
neither).  FAIL needs only evidence of failures (the sequential rule in `stats`): a run that
shows them fails even if it was otherwise too small.  So does a kv-canary violation the
engines counted during the run: the engine itself saw its KV garbled.

On an engine that is not deterministic the consistency samples are differential
(`Divergence`): the canary's warm-vs-cold divergence rate against the stable's, on the same
prompts.  Their excess FAILs a run like failures do.  Where the run also has samples judged
alone (tool-call echo), PASS rests on those and the excess only needs not to FAIL; where it
has none (a differential-only set), the excess's upper bound must clear its margin itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from dsv4_engine.kv_canary import Violations
from dsv4_engine.probe.stats import (
    excess_bounds,
    minimum_samples,
    percents,
    samples_to_pass,
    upper_bound,
)

# The corruption rate a changed path must be caught at among the samples that exercised it:
# the low end of the incident's 12-18% of tool calls garbled (seed/hicache-bf16-race.txt).
EXERCISED_DETECTABLE_RATE = 0.12


class Verdict(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"

    @property
    def exit_code(self) -> int:
        return {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 2}[self.value]


@dataclass(frozen=True)
class Divergence:
    """Differential consistency counts: how many warm answers changed, on each side."""

    n_canary: int
    canary: int
    n_stable: int
    stable: int
    margin: float
    """How far the canary's rate may exceed the stable's (`max_divergence_excess`)."""
    fail_at: int | None = None
    """Canary samples counted when the sequential FAIL rule on the excess fired."""

    def bounds(self, confidence: float) -> tuple[float, float]:
        return excess_bounds(self.canary, self.n_canary, self.stable, self.n_stable, confidence)

    def describe(self, confidence: float) -> str:
        lower, upper = self.bounds(confidence)
        return (
            f"warm answers changed on {self.canary}/{self.n_canary} canary and "
            f"{self.stable}/{self.n_stable} stable samples; excess {lower:+.2%} to {upper:+.2%} "
            f"at {confidence:.0%}, margin {self.margin:.2%}"
        )


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
    hicache: bool = False
    """The engine runs HiCache: a PASS needs exercised samples (`unexercised`)."""
    exercised: int = 0
    """Judged answers proven to have read a prefix back from the host tier."""
    host_tier_unread: str | None = None
    """Why the engines' host-tier reads, needed with HiCache, could not be read (no PASS)."""
    kv_canary: tuple[Violations, ...] = ()
    """kv-canary violations the engines counted during the run: each one FAILs it."""
    kv_canary_unread: str | None = None
    """Why the engines' kv-canary violations, asked for, could not be read (no PASS)."""
    divergence: Divergence | None = None
    """Differential consistency, when the run had any (see the module docstring)."""


def exercised_needed(confidence: float) -> int:
    """Fewest judged answers that must read a prefix back from the host tier before a
    HiCache run may PASS: 24 at 95%.  It is `minimum_samples` at EXERCISED_DETECTABLE_RATE:
    if the host-tier path garbled 12% of the answers that take it (the incident garbled 12-18%
    of tool calls), the chance that that many exercised answers all come back clean,
    (1 - 0.12) ** 24 = 4.6%, is below 1 - confidence — so a PASS cannot rest on too few of
    them to have shown the incident."""
    return minimum_samples(EXERCISED_DETECTABLE_RATE, confidence)


def unexercised(hicache: bool, exercised: int, judged: int, confidence: float) -> str | None:
    """Why a run cannot PASS for want of samples that took the host-tier path, or None.

    THE rule, for the probe's verdict and the operator's re-check of a filed PASS alike.
    Without HiCache there is no host tier to exercise, and nothing is required."""
    if not hicache:
        return None
    needed = exercised_needed(confidence)
    if exercised >= needed:
        return None
    return (
        f"HiCache is on but only {exercised} judged answers are proven to have read a prefix "
        f"back from the host tier; at least {needed} required"
    )


def decide(ev: Evidence) -> tuple[Verdict, tuple[str, ...]]:
    failed = ev.corrupt + ev.transport_errors
    bound = upper_bound(failed, ev.judged, ev.confidence)
    shown, budget = percents(bound, ev.threshold)
    counted = f"{failed}/{ev.judged} failed: {ev.corrupt} corrupt, {ev.transport_errors} requests without an answer"
    div = ev.divergence
    if ev.fail_at is not None or ev.kv_canary or (div is not None and div.fail_at is not None):
        failures = []
        if ev.fail_at is not None:
            failures.append(
                f"failures above {ev.threshold:.3%} at {ev.confidence:.0%} confidence after "
                f"{ev.fail_at} judged samples ({counted})"
            )
        if ev.kv_canary:
            found = "; ".join(v.describe() for v in ev.kv_canary)
            failures.append(f"kv-canary violations during the run: {found}")
        if div is not None and div.fail_at is not None:
            failures.append(
                f"the canary's answers diverge more than the stable's by over {div.margin:.2%} "
                f"after {div.fail_at} samples: {div.describe(ev.confidence)}"
            )
        return Verdict.FAIL, tuple(failures)
    reasons = []
    if ev.kv_canary_unread is not None:
        reasons.append(f"kv-canary violations not read: {ev.kv_canary_unread}")
    if ev.hicache and ev.host_tier_unread is not None:
        reasons.append(f"host-tier reads not read: {ev.host_tier_unread}")
    if ev.applicable_probes == 0:
        reasons.append("no probe of the set applies to this engine")
    if ev.peak_concurrency < ev.target_concurrency:
        reasons.append(
            f"reached {ev.peak_concurrency} requests in flight, target {ev.target_concurrency}"
        )
    if (why := unexercised(ev.hicache, ev.exercised, ev.judged, ev.confidence)) is not None:
        reasons.append(why)
    alone = ev.judged > 0 or div is None  # samples judged alone carry the PASS
    if alone and bound >= ev.threshold:
        needed = samples_to_pass(ev.threshold, ev.confidence, failed)
        reasons.append(
            f"upper bound {shown} is not below {budget}: {ev.judged} judged "
            f"samples, {needed} needed with {failed} failed ({counted})"
        )
    if not alone and div is not None and div.bounds(ev.confidence)[1] >= div.margin:
        reasons.append(f"the excess is not bounded below its margin: {div.describe(ev.confidence)}")
    if reasons:
        return Verdict.INCONCLUSIVE, tuple(reasons)
    passed = []
    if alone:
        passed.append(
            f"upper bound {shown} < {budget} at {ev.confidence:.0%} confidence ({counted})"
        )
    if div is not None:
        passed.append(f"differential consistency: {div.describe(ev.confidence)}")
    return Verdict.PASS, tuple(passed)
