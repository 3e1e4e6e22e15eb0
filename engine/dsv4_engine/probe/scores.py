"""Per-class precision and recall of the validator against a labelled corpus.

Why per class: one accuracy number hides which way the validator errs — a class with low
precision raises false alarms (a clean canary rolled back), one with low recall lets that
damage through.  VALID is scored like any other class: its precision is the share of
answers called clean that were clean.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from dsv4_engine.probe.outcome import VALIDATOR_OUTCOMES, Outcome


@dataclass(frozen=True)
class ClassScore:
    outcome: Outcome
    labelled: int
    """How many answers carry this label (the recall's denominator)."""
    judged: int
    """How many answers the validator put in this class (the precision's denominator)."""
    correct: int

    @property
    def precision(self) -> float | None:
        return self.correct / self.judged if self.judged else None

    @property
    def recall(self) -> float | None:
        return self.correct / self.labelled if self.labelled else None


def score(pairs: Iterable[tuple[Outcome, Outcome]]) -> list[ClassScore]:
    """One score per validator class from (label, judged) pairs, in the report's order."""
    pairs = list(pairs)
    return [
        ClassScore(
            outcome,
            labelled=sum(label is outcome for label, _ in pairs),
            judged=sum(judged is outcome for _, judged in pairs),
            correct=sum(label is outcome and judged is outcome for label, judged in pairs),
        )
        for outcome in VALIDATOR_OUTCOMES
    ]


def score_table(scores: Iterable[ClassScore]) -> str:
    """The scores as a fixed-width table (a class never labelled nor judged is left out)."""
    lines = [f"{'class':<18} {'labelled':>8} {'judged':>6} {'precision':>9} {'recall':>6}"]
    for s in scores:
        if s.labelled or s.judged:
            lines.append(
                f"{s.outcome.value:<18} {s.labelled:>8} {s.judged:>6} "
                f"{_percent(s.precision):>9} {_percent(s.recall):>6}"
            )
    return "\n".join(lines)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"
