"""Exact bounds against scipy, and the sequential rules' error rates by seeded simulation."""

import itertools
import math
import random

import pytest
from scipy import special
from scipy import stats as sp

from dsv4_engine.probe import stats


@pytest.mark.parametrize("a", [0.5, 1, 3, 40, 900])
@pytest.mark.parametrize("b", [0.5, 1, 7, 300, 5000])
def test_betainc_matches_scipy(a, b):
    for x in (1e-6, 0.001, 0.005, 0.1, 0.5, 0.9, 0.999):
        assert stats.betainc(a, b, x) == pytest.approx(
            special.betainc(a, b, x), rel=1e-9, abs=1e-14
        )


@pytest.mark.parametrize("n", [1, 10, 100, 598, 5000])
def test_clopper_pearson_bounds_match_scipy(n):
    for failures in sorted({0, 1, n // 10, n // 2, n - 1, n}):
        want_upper = 1.0 if failures == n else sp.beta.ppf(0.95, failures + 1, n - failures)
        want_lower = 0.0 if failures == 0 else sp.beta.ppf(0.05, failures, n - failures + 1)
        assert stats.upper_bound(failures, n, 0.95) == pytest.approx(want_upper, abs=1e-9)
        assert stats.lower_bound(failures, n, 0.95) == pytest.approx(want_lower, abs=1e-9)


def test_samples_to_pass_at_half_a_percent():
    # Zero failures: (1 - 0.005)^n <= 0.05  <=>  n >= ln 0.05 / ln 0.995 = 597.6
    assert stats.samples_to_pass(0.005, 0.95) == math.ceil(math.log(0.05) / math.log(0.995)) == 598
    n1 = stats.samples_to_pass(0.005, 0.95, failures=1)
    assert stats.upper_bound(1, n1, 0.95) < 0.005 <= stats.upper_bound(1, n1 - 1, 0.95)


def _critical_counts(n_max: int, threshold: float, confidence: float) -> list[int]:
    """Fewest failures that FAIL at each n (monotone in failures; no look before n0)."""
    counts, x = [n + 1 for n in range(stats.FAIL_FIRST_LOOK)], 1
    for n in range(stats.FAIL_FIRST_LOOK, n_max + 1):
        while x <= n and not stats.fail_now(x, n, threshold, confidence):
            x += 1
        counts.append(x)
    return counts


def _first_fail(rng: random.Random, rate: float, critical: list[int]) -> int | None:
    failures = 0
    for n in range(1, len(critical)):
        failures += rng.random() < rate
        if failures >= critical[n]:
            return n
    return None


def test_fail_rule_rarely_fires_at_the_threshold_however_often_we_look():
    """True rate exactly at the threshold: FAIL must stay below alpha over 600 looks."""
    critical = _critical_counts(600, 0.05, 0.95)
    rng = random.Random(7)
    runs = 2000
    false_fails = sum(_first_fail(rng, 0.05, critical) is not None for _ in range(runs))
    assert false_fails / runs <= 0.05


def test_twelve_percent_corruption_fails_within_tens_of_samples():
    critical = _critical_counts(400, 0.005, 0.95)
    rng = random.Random(11)
    firsts = sorted(_first_fail(rng, 0.12, critical) or 10**6 for _ in range(500))
    median, p95 = firsts[len(firsts) // 2], firsts[int(len(firsts) * 0.95)]
    print(f"12% corruption: FAIL after median {median}, p95 {p95} judged samples")
    assert stats.FAIL_FIRST_LOOK <= firsts[0]
    assert median <= 40 and p95 <= 100


@pytest.mark.parametrize("n", [100, 598, 947, 3000])
def test_pass_at_the_threshold_is_rare_in_a_fixed_size_run(n):
    """P(upper bound < threshold | true rate = threshold) <= alpha, computed exactly."""
    passing = list(
        itertools.takewhile(lambda x: stats.upper_bound(x, n, 0.95) < 0.005, range(n + 1))
    )
    assert sum(sp.binom.pmf(x, n, 0.005) for x in passing) <= 0.05


def _cp(failures: int, n: int, side: str, level: float) -> float:
    if side == "upper":
        return 1.0 if failures == n else sp.beta.ppf(level, failures + 1, n - failures)
    return 0.0 if failures == 0 else sp.beta.ppf(1 - level, failures, n - failures + 1)


@pytest.mark.parametrize(
    ("canary", "n_canary", "stable", "n_stable"),
    [(0, 100, 0, 100), (30, 598, 20, 598), (5, 40, 0, 38), (100, 100, 3, 90)],
)
def test_the_excess_bounds_are_two_clopper_pearson_bounds_at_half_the_alpha(
    canary, n_canary, stable, n_stable
):
    lower, upper = stats.excess_bounds(canary, n_canary, stable, n_stable, 0.95)
    want_lower = _cp(canary, n_canary, "lower", 0.975) - _cp(stable, n_stable, "upper", 0.975)
    want_upper = _cp(canary, n_canary, "upper", 0.975) - _cp(stable, n_stable, "lower", 0.975)
    assert (lower, upper) == (
        pytest.approx(want_lower, abs=1e-9),
        pytest.approx(want_upper, abs=1e-9),
    )


@pytest.mark.parametrize(("p_canary", "p_stable"), [(0.15, 0.10), (0.45, 0.45), (0.05, 0.0)])
def test_the_excess_bounds_cover_the_true_excess(p_canary, p_stable):
    """Seeded draws at a low confidence (so misses are frequent enough to count): each
    bound misses the true excess p_canary - p_stable at most 1 - confidence of the time,
    whatever the stable's own rate — the guarantee the FAIL and PASS rules rest on."""
    rng, n, confidence, draws = random.Random(7), 150, 0.8, 600
    truth, over, under = p_canary - p_stable, 0, 0
    for _ in range(draws):
        canary = sum(rng.random() < p_canary for _ in range(n))
        stable = sum(rng.random() < p_stable for _ in range(n))
        lower, upper = stats.excess_bounds(canary, n, stable, n, confidence)
        over += lower > truth
        under += upper < truth
    assert over / draws <= 1 - confidence and under / draws <= 1 - confidence


def test_the_excess_fail_rule_spends_alpha_over_looks_as_the_single_rate_rule_does():
    """Each look tests the excess's lower bound at 1 - fail_alpha(n): the same schedule as
    `fail_now`, so the union bound over every look holds for it too."""
    assert not stats.excess_fail_now(9, 9, 0, 9, 0.05, 0.95)  # no look before n0
    n = 100
    for canary in range(0, n + 1, 5):
        lower, _ = stats.excess_bounds(canary, n, 10, n, 1 - stats.fail_alpha(n, 0.95))
        assert stats.excess_fail_now(canary, n, 10, n, 0.05, 0.95) is (lower > 0.05)


def test_a_raced_canary_above_its_stables_noise_fails_within_tens_of_samples():
    """40% changed answers against a stable's 10%: the excess rule fires within the 598
    samples a canary runs by default (conservative: Bonferroni twice over, for the two
    sides and for the looks)."""
    rng, canary, stable = random.Random(3), 0, 0
    for n in range(1, 301):
        canary += rng.random() < 0.40
        stable += rng.random() < 0.10
        if stats.excess_fail_now(canary, n, stable, n, 0.05, 0.95):
            break
    assert n < 300
