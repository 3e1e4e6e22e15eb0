"""The verdict with differential consistency (`verdict.Divergence`): an excess over the
stable's own divergence FAILs; samples judged alone carry a PASS where there are any, and
the excess's bound carries it where there are none."""

from __future__ import annotations

from dataclasses import replace

from dsv4_engine.probe.verdict import Divergence, Evidence, Verdict, decide
from tests.unit.probe.test_bound_display import evidence as judged_alone


def evidence(judged: int, divergence: Divergence) -> Evidence:
    """``judged`` samples judged alone, all clean, beside the differential ones."""
    return replace(judged_alone(judged), divergence=divergence)


def test_an_excess_over_the_stables_noise_fails_and_says_both_rates():
    raced = Divergence(60, 25, 60, 6, margin=0.05, fail_at=60)
    verdict, (why,) = decide(evidence(598, raced))
    assert verdict is Verdict.FAIL
    assert "diverge more than the stable's by over 5.00% after 60 samples" in why
    assert "25/60 canary and 6/60 stable" in why


def test_with_samples_judged_alone_the_excess_only_has_to_not_fail():
    """A mixed set (tool-call echo + consistency on SGLang): the echo samples carry the
    PASS; 150 noisy consistency samples could never bound the excess below 5%."""
    noisy = Divergence(150, 68, 150, 66, margin=0.05)
    verdict, reasons = decide(evidence(598, noisy))
    assert verdict is Verdict.PASS
    assert reasons[1].startswith("differential consistency: warm answers changed on 68/150")


def test_without_samples_judged_alone_the_excess_bound_carries_the_pass():
    clean = Divergence(598, 30, 598, 30, margin=0.05)
    assert decide(evidence(0, clean))[0] is Verdict.PASS
    few = Divergence(100, 5, 100, 5, margin=0.05)
    verdict, (why,) = decide(evidence(0, few))
    assert verdict is Verdict.INCONCLUSIVE
    assert why.startswith("the excess is not bounded below its margin")
