"""A bound and its budget are shown in as many digits as tell them apart: at the default 598
samples a clean run's bound is 0.49967%, and "0.500% < 0.500%" (what three decimals printed
in the demo's PASS report) reads as a contradiction to the person deciding on it."""

from __future__ import annotations

from dsv4_engine.probe.stats import minimum_samples, percents, upper_bound
from dsv4_engine.probe.verdict import Evidence, Verdict, decide
from dsv4_operator.rollout.decide import ProbeOutcome, RolloutVerdict, evidence_text

BUDGET, CONFIDENCE = 0.005, 0.95
N = minimum_samples(BUDGET, CONFIDENCE)  # 598


def test_a_bound_just_below_its_budget_reads_below_it():
    bound = upper_bound(0, N, CONFIDENCE)
    assert percents(bound, BUDGET) == ("0.4997%", "0.5000%")


def test_distinct_values_keep_three_decimals_and_equal_ones_stay_equal():
    assert percents(0.0123, BUDGET) == ("1.230%", "0.500%")
    assert percents(BUDGET, BUDGET) == ("0.500%", "0.500%")
    bound = upper_bound(0, 4603, 0.99)  # 0.1% at 99%: the bound is 0.09999…%
    shown, budget = percents(bound, 0.001)
    assert shown != budget and float(shown[:-1]) < float(budget[:-1])


def evidence(judged: int) -> Evidence:
    return Evidence(
        judged=judged,
        corrupt=0,
        transport_errors=0,
        fail_at=None,
        peak_concurrency=64,
        target_concurrency=64,
        threshold=BUDGET,
        confidence=CONFIDENCE,
        applicable_probes=1,
    )


def test_the_pass_reason_at_the_minimum_shows_the_bound_below_the_budget():
    verdict, (reason,) = decide(evidence(N))
    assert verdict is Verdict.PASS
    assert reason.startswith("upper bound 0.4997% < 0.5000% at 95% confidence")


def test_one_sample_short_the_inconclusive_reason_shows_it_above():
    verdict, reasons = decide(evidence(N - 1))
    assert verdict is Verdict.INCONCLUSIVE
    assert any("upper bound 0.501% is not below 0.500%" in r for r in reasons)


def test_the_rollouts_message_shows_the_budget_the_run_was_judged_against():
    outcome = ProbeOutcome(
        RolloutVerdict.PASS, 0.0, upper_bound(0, N, CONFIDENCE), N, "r", threshold=BUDGET
    )
    assert evidence_text(outcome) == (
        "PASS: failure rate (corrupt or unanswered) 0.00% (upper bound 0.4997%, budget 0.5000%) over 598 samples"
    )
    older = ProbeOutcome(RolloutVerdict.PASS, 0.0, upper_bound(0, N, CONFIDENCE), N, "r")
    assert "upper bound 0.500%" in evidence_text(older)  # a report that did not record it
