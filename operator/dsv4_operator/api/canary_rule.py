"""The CEL rule that refuses a canary section that can never PASS, generated from the one
rule in `dsv4_engine.probe.stats` (`can_pass`, `minimum_samples`).

Why generated, and why this shape: Kubernetes' CEL has no logarithm or power function, so
"(1 - maxCorruptionRate) ** requests < 1 - confidence" is computed exactly as
`stats.survival` computes it — the squares of 1 - rate, multiplied highest bit first where
`requests` has a bit.  A one-element list mapped to a name (`[x].map(a, …)[0]`) is CEL's
only way to name a value, so the 17 squares are 17 nested bindings; the message's minimum
is `stats.minimum_samples`' greedy walk over the same squares, unrolled.  Identical
arithmetic on both sides means the API server and the probe never disagree at the boundary
(tests/e2e check a grid of settings at their limit and one below).
"""

from __future__ import annotations

from dsv4_engine.probe.stats import MAX_REQUESTS, REQUEST_BITS

_ALPHA = "(1.0 - self.confidence)"
_BITS = tuple(reversed(range(REQUEST_BITS)))  # highest first, as `stats.survival` multiplies


def _with_squares(body: str) -> str:
    """``body`` with a0 = 1 - maxCorruptionRate, a1 = a0², … a16 bound."""
    expr = body
    for bit in reversed(range(REQUEST_BITS)):
        value = "1.0 - self.maxCorruptionRate" if bit == 0 else f"a{bit - 1} * a{bit - 1}"
        expr = f"[{value}].map(a{bit}, {expr})[0]"
    return expr


def _clears(n: str) -> str:
    """(1 - rate) ** n < 1 - confidence: zero corruption in n samples can PASS."""
    factors = " * ".join(f"({n} / {1 << bit} % 2 == 1 ? a{bit} : 1.0)" for bit in _BITS)
    return f"{factors} < {_ALPHA}"


def _minimum() -> str:
    """The fewest requests that can PASS, as a double: greedy over [kept, survival] pairs."""
    state = "[0.0, 1.0]"
    for bit in _BITS:
        take = f"[s[0] + {float(1 << bit)}, s[1] * a{bit}]"
        state = f"[{state}].map(s, s[1] * a{bit} >= {_ALPHA} ? {take} : s)[0]"
    return f"{state}[0] + 1.0"


_DIGITS = "['0', '1', '2', '3', '4', '5', '6', '7', '8', '9']"


def _decimal(n: str) -> str:
    """Decimal digits of the int ``n`` (0 <= n <= MAX_REQUESTS), from a digit table:
    `string(int)` has no size bound for the API server's cost estimate, a table lookup has."""
    width = len(str(MAX_REQUESTS))
    spelled = "'0'"
    for digits in range(1, width + 1):
        text = " + ".join(f"{_DIGITS}[n / {10**k} % 10]" for k in reversed(range(digits)))
        spelled = f"n >= {10 ** (digits - 1)} ? ({text}) : {spelled}"
    return f"[{n}].map(n, {spelled})[0]"


def requests_can_pass_rule() -> dict[str, str]:
    """The `x-kubernetes-validations` entry of `spec.canary` (fieldPath `.requests`): the set
    request count, or the default (the minimum) when unset, must be able to PASS."""
    least = f"int({_with_squares(_minimum())})"
    minimum = (
        f"({least} > {MAX_REQUESTS} ? 'more than {MAX_REQUESTS}, which is more than a run may "
        f"take: lower confidence or raise maxCorruptionRate' : {_decimal(least)})"
    )
    asked = f"(has(self.requests) ? {_decimal('self.requests')} : 'the default')"
    message = (
        f"{asked} + ' requests can never PASS at this maxCorruptionRate and confidence: "
        "with no corruption at all the upper bound would still not be below the rate; the "
        f"minimum is ' + {minimum}"
    )
    clears = f"has(self.requests) ? {_clears('self.requests')} : {_clears(str(MAX_REQUESTS))}"
    return {
        "rule": _with_squares(f"({clears})"),
        "messageExpression": message,
        "message": "too few requests to ever PASS at this maxCorruptionRate and confidence",
        "fieldPath": ".requests",
    }
