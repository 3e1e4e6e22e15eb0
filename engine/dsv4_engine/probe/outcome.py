"""The classes a probed answer can fall into, and the outcome of classifying one.

One enum for the validator, the probe runner, the report and its JSON schema, so a class
name means the same thing in `dsv4ctl validate`, `dsv4ctl probe` and the canary.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Outcome(StrEnum):
    VALID = "VALID"
    LEAKED_MARKUP = "LEAKED_MARKUP"
    UNBALANCED = "UNBALANCED"
    TRUNCATED = "TRUNCATED"
    ENVELOPE_MISMATCH = "ENVELOPE_MISMATCH"
    SCHEMA = "SCHEMA"
    ARG_CORRUPTION = "ARG_CORRUPTION"
    DEGENERATE_TEXT = "DEGENERATE_TEXT"
    # Probe-only outcomes: the validator never returns these.
    CACHE_MISMATCH = "CACHE_MISMATCH"
    """A greedy answer changed after its prefix went through the host tier."""
    DIVERGED = "DIVERGED"
    """A warm answer changed on an engine that is not deterministic: not corruption by
    itself; the canary's rate of these is judged against the stable's (differential)."""
    TRANSPORT_ERROR = "TRANSPORT_ERROR"
    """No answer to judge (connection, timeout, HTTP error, a body that is no chat answer):
    not corruption, but a failed request, and the probe's bounds count it as a failure."""
    NOT_APPLICABLE = "NOT_APPLICABLE"
    """The check cannot judge this engine (e.g. consistency on a non-deterministic one)."""

    @property
    def is_corruption(self) -> bool:
        return self not in _NOT_CORRUPTION

    @property
    def is_failure(self) -> bool:
        """What a canary's bounds count: a corrupt answer, or a request that got none."""
        return self.is_corruption or self is Outcome.TRANSPORT_ERROR


_NOT_CORRUPTION = frozenset(
    {Outcome.VALID, Outcome.DIVERGED, Outcome.TRANSPORT_ERROR, Outcome.NOT_APPLICABLE}
)

VALIDATOR_OUTCOMES: tuple[Outcome, ...] = (
    Outcome.VALID,
    Outcome.LEAKED_MARKUP,
    Outcome.UNBALANCED,
    Outcome.TRUNCATED,
    Outcome.ENVELOPE_MISMATCH,
    Outcome.SCHEMA,
    Outcome.ARG_CORRUPTION,
    Outcome.DEGENERATE_TEXT,
)


@dataclass(frozen=True)
class Judgement:
    """What a check concluded about one answer; `detail` says why, for the report."""

    outcome: Outcome
    detail: str = ""

    @property
    def valid(self) -> bool:
        return self.outcome is Outcome.VALID


VALID = Judgement(Outcome.VALID)
