"""Exact binomial bounds and the verdict's stopping rules.

Why exact (Clopper–Pearson) bounds: the rates we care about are tiny (a 0.5% threshold)
and failures are rare events, where normal approximations are badly optimistic.  The
regularized incomplete beta function is implemented here (continued fraction, Lentz's
method) because the operator image has no scipy; the tests check it against scipy.

The two rules and why they stay honest under repeated looks:

* PASS is decided once, at the end of the run, from the one-sided upper bound at
  `confidence`.  Stopping early for FAIL only removes paths that could have ended in PASS,
  so P(PASS | true rate ≥ threshold) ≤ 1 - confidence whatever the FAIL rule does.
* FAIL is checked after every judged sample n ≥ n0 = FAIL_FIRST_LOOK, against a one-sided
  Clopper–Pearson lower bound at level alpha_n = alpha · n0 / (n (n + 1)).  These levels sum
  to alpha over all n ≥ n0 (a telescoping sum), so by the union bound
  P(ever FAIL | true rate ≤ threshold) ≤ alpha = 1 - confidence, however often we look
  (alpha spending with a Bonferroni schedule).  Starting at n0 = 10 keeps a single unlucky
  first answer from failing a rollout and spends the alpha where the evidence is; at a 12%
  corruption rate against a 0.5% threshold the rule fires after a median of ~25 judged
  samples ("tens, not hundreds"; `make bench-probe` prints the distribution).
  An SPRT would need a second, arbitrary alternative rate; this rule needs none.

"lower bound > threshold" is tested in its dual form P(X ≥ x | n, threshold) < alpha_n,
one incomplete-beta evaluation per sample, so the probe client never waits on statistics.
"""

from __future__ import annotations

import math

_EPS = 3e-16
_TINY = 1e-300
_MAX_ITER = 10_000
FAIL_FIRST_LOOK = 10


def _beta_cf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, _MAX_ITER):
        m2 = 2 * m
        for num in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + num / c
            c = c if abs(c) > _TINY else _TINY
            delta = d * c
            h *= delta
        if abs(delta - 1.0) < _EPS:
            return h
    raise ArithmeticError(f"incomplete beta did not converge (a={a}, b={b}, x={x})")


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b) for a, b > 0 and 0 ≤ x ≤ 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_cf(a, b, x) / a
    return 1.0 - front * _beta_cf(b, a, 1.0 - x) / b


def _beta_ppf(q: float, a: float, b: float) -> float:
    """Quantile of Beta(a, b) by bisection: monotone, no derivative, 1e-12 precise."""
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if betainc(a, b, mid) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return (lo + hi) / 2


def upper_bound(failures: int, n: int, confidence: float) -> float:
    """One-sided Clopper–Pearson upper bound on the rate (1.0 when nothing was judged)."""
    if n == 0 or failures >= n:
        return 1.0
    return _beta_ppf(confidence, failures + 1, n - failures)


def lower_bound(failures: int, n: int, confidence: float) -> float:
    """One-sided Clopper–Pearson lower bound on the rate."""
    if failures == 0:
        return 0.0
    return _beta_ppf(1.0 - confidence, failures, n - failures + 1)


def tail_at_least(failures: int, n: int, rate: float) -> float:
    """P(X ≥ failures) for X ~ Binomial(n, rate): the p-value of "rate is above `rate`"."""
    if failures <= 0:
        return 1.0
    if failures > n:
        return 0.0
    return betainc(failures, n - failures + 1, rate)


def fail_alpha(n: int, confidence: float) -> float:
    """The share of alpha = 1 - confidence spent on the look after judged sample n."""
    if n < FAIL_FIRST_LOOK:
        return 0.0
    return (1.0 - confidence) * FAIL_FIRST_LOOK / (n * (n + 1))


def fail_now(failures: int, n: int, threshold: float, confidence: float) -> bool:
    """The sequential FAIL rule (see module docstring)."""
    alpha = fail_alpha(n, confidence)
    return alpha > 0 and tail_at_least(failures, n, threshold) < alpha


def fail_boundary_lower(failures: int, n: int, confidence: float) -> float:
    """The alpha-spent lower bound FAIL compares with the threshold (for plots and reports)."""
    alpha = fail_alpha(n, confidence)
    return lower_bound(failures, n, 1.0 - alpha) if alpha > 0 else 0.0


# -- differential: the canary's rate against the stable's, on an engine with noise --------
#
# On an engine that is not deterministic, a healthy server's warm answer differs from its
# cold one at some rate of its own, so a canary's divergence means something only beside
# the stable's, measured on the same prompts in the same run.  The excess d = p_canary -
# p_stable is bounded by combining one-sided Clopper–Pearson bounds at alpha/2 each
# (Bonferroni): P(lower_c > p_c) <= alpha/2 and P(upper_s < p_s) <= alpha/2, so
# P(lower_c - upper_s > d) <= alpha, exactly, whatever the two rates — no normal
# approximation, which the small rates and tails here would make optimistic.  It is
# conservative (an exact unconditional test such as Boschloo's is sharper, but needs a
# search over the nuisance rate per look).  The FAIL rule spends alpha over looks as above.


def excess_bounds(
    canary: int, n_canary: int, stable: int, n_stable: int, confidence: float
) -> tuple[float, float]:
    """(lower, upper) one-sided bounds on p_canary - p_stable, each at ``confidence``."""
    half = 1.0 - (1.0 - confidence) / 2
    lower = lower_bound(canary, n_canary, half) - upper_bound(stable, n_stable, half)
    upper = upper_bound(canary, n_canary, half) - lower_bound(stable, n_stable, half)
    return lower, upper


def excess_fail_now(
    canary: int, n_canary: int, stable: int, n_stable: int, margin: float, confidence: float
) -> bool:
    """The sequential FAIL rule on the excess: its alpha-spent lower bound above ``margin``
    (P(ever FAIL | excess <= margin) <= 1 - confidence, as `fail_now`)."""
    alpha = fail_alpha(min(n_canary, n_stable), confidence)
    if alpha <= 0:
        return False
    return excess_bounds(canary, n_canary, stable, n_stable, 1.0 - alpha)[0] > margin


# Largest request count the canary API accepts: 17 bits, so `survival` needs 17 squarings
# (and the CRD's CEL rule, which performs the same arithmetic, 17 nested bindings).
MAX_REQUESTS = 100_000
REQUEST_BITS = MAX_REQUESTS.bit_length()


def _squares(rate: float) -> list[float]:
    """(1 - rate) ** (2 ** bit) for every bit of a request count, by repeated squaring."""
    squares = [1.0 - rate]
    for _ in range(REQUEST_BITS - 1):
        squares.append(squares[-1] * squares[-1])
    return squares


def survival(rate: float, n: int) -> float:
    """(1 - rate) ** n by binary powering: the chance that n samples at ``rate`` are all clean.

    Spelled out (squares of 1 - rate, multiplied highest bit first where n has a bit) rather
    than ``**`` because the CRD's CEL rule (dsv4_operator.api.canary_rule) can only multiply:
    both sides then round identically, so the API server and the probe never disagree at the
    boundary.
    """
    if not 0 <= n <= MAX_REQUESTS:
        raise ValueError(f"n must be in 0..{MAX_REQUESTS}, got {n}")
    result = 1.0
    for bit, square in reversed(list(enumerate(_squares(rate)))):
        if (n >> bit) & 1:
            result *= square
    return result


def can_pass(n: int, threshold: float, confidence: float) -> bool:
    """Whether n judged samples with no corruption at all put the exact upper bound below
    ``threshold``: 1 - (1 - confidence) ** (1 / n) < threshold, i.e. (1 - threshold) ** n <
    1 - confidence.  Fewer samples can never PASS, whatever the engine does."""
    return survival(threshold, n) < 1.0 - confidence


def minimum_samples(threshold: float, confidence: float) -> int:
    """THE rule for "enough samples to PASS": the fewest judged samples that can PASS at
    ``threshold`` and ``confidence`` (598 at 0.5% and 95%).  The canary's default request
    count, `dsv4ctl probe`'s default and the CRD's CEL refusal are all this number; above
    MAX_REQUESTS it is MAX_REQUESTS + 1 (no accepted setting can PASS).

    Found greedily, highest bit first: the largest n whose survival stays >= 1 - confidence
    takes each square that keeps it there, and multiplies exactly as `survival` does, so
    ``can_pass(minimum_samples(...))`` holds and ``can_pass(minimum_samples(...) - 1)`` not.
    """
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be in (0, 1), got {threshold}")
    alpha, kept, survive = 1.0 - confidence, 0, 1.0
    for bit, square in reversed(list(enumerate(_squares(threshold)))):
        if survive * square >= alpha:
            kept, survive = kept + (1 << bit), survive * square
    return min(kept + 1, MAX_REQUESTS + 1)


def samples_to_pass(threshold: float, confidence: float, failures: int = 0) -> int:
    """Fewest judged samples whose upper bound is below `threshold` with `failures` seen."""
    if failures == 0:
        return minimum_samples(threshold, confidence)
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be in (0, 1), got {threshold}")
    n = max(failures + 1, math.ceil(math.log(1.0 - confidence) / math.log1p(-threshold)))
    while upper_bound(failures, n, confidence) >= threshold:
        n += max(1, n // 100)
    while n > failures + 1 and upper_bound(failures, n - 1, confidence) < threshold:
        n -= 1
    return n


def percents(value: float, reference: float, places: int = 3) -> tuple[str, str]:
    """``value`` and ``reference`` as percentages, with at least ``places`` decimals and, when
    they differ, as many more as it takes to read differently.  A PASS's bound sits just
    below its budget (0.4997% at the default 598 samples for 0.5%): "0.500% < 0.500%" would
    read as a contradiction, and an INCONCLUSIVE's bound just above it as equality."""
    for more in range(places, 12):
        shown = f"{value:.{more}%}", f"{reference:.{more}%}"
        if shown[0] != shown[1] or value == reference:
            return shown
    return shown
