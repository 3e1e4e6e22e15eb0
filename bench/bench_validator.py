"""The validator on the combined labelled corpus, and on held-out completions it has never seen.

First the corpus: runs `dsv4ctl validate --format F tests/data/dsml_corpus/corpus_F.jsonl
--output json --score` for each format, as a user would, sums the per-class counts of the
three summary lines and prints the combined table, then the time the validator takes per
completion.

Then the held-out set: every producer of `tests/unit/probe/producers.py` (DeepSeek's
encoders rendering real-looking conversations, SGLang's detector serving them, token-stream
mutations, derailed prose) makes `--size` cases per format from `--seed` — by default a
fresh one, printed, so a run can be repeated; the tests' generators use integer seeds and
never these.  Per producer: the count, the agreement (the validator's class is one the
producer allows) and the per-class table over the cases with one right class; then the
combined table and the first disagreements.  The producers live with the tests that use
them (one copy for both), so run from the repository root as a module: `python -m
bench.bench_validator [--seed N] [--size N]` (what `make bench-validator` does).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import secrets
import time
from collections.abc import Sequence
from pathlib import Path

from dsv4_engine.probe.dsml import DsmlFormat
from dsv4_engine.probe.outcome import Judgement, Outcome
from dsv4_engine.probe.scores import ClassScore, score, score_table
from dsv4_engine.probe.validate import classify_records
from dsv4_operator.cli.main import main
from tests.unit.probe.producers import PRODUCERS, Case, held_out

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "data" / "dsml_corpus"


def summary(fmt: DsmlFormat) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(
            [
                "validate",
                "--format",
                fmt.value,
                str(CORPUS / f"corpus_{fmt}.jsonl"),
                "--output",
                "json",
                "--score",
            ]
        )
    return json.loads(out.getvalue().splitlines()[-1])["summary"]


def combined(summaries: list[dict]) -> list[ClassScore]:
    totals: dict[str, dict[str, int]] = {}
    for s in summaries:
        for name, counts in s["scores"].items():
            for key, n in counts.items():
                totals.setdefault(name, {}).setdefault(key, 0)
                totals[name][key] += n
    return [ClassScore(Outcome(name), **counts) for name, counts in totals.items()]


def corpus_report() -> None:
    summaries = [summary(fmt) for fmt in DsmlFormat]
    total = sum(s["total"] for s in summaries)
    print(f"combined corpus: {total} completions in {len(summaries)} formats")
    print(score_table(combined(summaries)))
    lines = {fmt: (CORPUS / f"corpus_{fmt}.jsonl").read_text().splitlines() for fmt in DsmlFormat}
    start = time.perf_counter()
    rounds = 20
    for _ in range(rounds):
        for fmt, records in lines.items():
            classify_records(records, fmt, fmt.value)
    per = (time.perf_counter() - start) / (rounds * total)
    print(f"validator: {per * 1e6:.0f} µs per completion (a tool set is compiled once)")


def held_out_report(seed: int, size: int, shown: int) -> None:
    """Generate and judge the held-out set; print each producer's numbers and the total."""
    start = time.perf_counter()
    judged = {
        name: [(case, case.judge()) for case in _cases(name, seed, size)] for name in PRODUCERS
    }
    total = sum(map(len, judged.values()))
    print(f"\nheld-out set: seed {seed}, {size} cases per producer and format, {total} in all")
    for name, results in judged.items():
        _producer_report(name, results)
    everything = [r for results in judged.values() for r in results]
    print(f"\nall producers: {_agreement(everything)}")
    print(score_table(_scores(everything)))
    _disagreements(everything, shown)
    print(f"held-out set generated and judged in {time.perf_counter() - start:.1f} s")


def _cases(name: str, seed: int, size: int) -> list[Case]:
    return [held_out(name, fmt, seed, i) for fmt in DsmlFormat for i in range(size)]


def _producer_report(name: str, results: Sequence[tuple[Case, Judgement]]) -> None:
    labelled = sum(case.label is not None for case, _ in results)
    print(
        f"\n{name}: {len(results)} cases ({labelled} with one right class), {_agreement(results)}"
    )
    print(score_table(_scores(results)))


def _agreement(results: Sequence[tuple[Case, Judgement]]) -> str:
    agreed = sum(case.agrees(judged.outcome) for case, judged in results)
    return f"agreement {agreed}/{len(results)} = {agreed / len(results):.1%}"


def _scores(results: Sequence[tuple[Case, Judgement]]) -> list[ClassScore]:
    """Per-class scores over the cases with one right class (the others have no label)."""
    return score((case.label, j.outcome) for case, j in results if case.label is not None)


def _disagreements(results: Sequence[tuple[Case, Judgement]], shown: int) -> None:
    wrong = [(case, judged) for case, judged in results if not case.agrees(judged.outcome)]
    for case, judged in wrong[:shown]:
        allowed = "|".join(sorted(o.value for o in case.accepted))
        print(f"  {case.producer} {case.fmt}: {judged.outcome} where {allowed}: {judged.detail}")
        print(f"    …{case.text[-240:]!r}")


def main_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=secrets.randbits(32), help="held-out seed")
    parser.add_argument("--size", type=int, default=100, help="cases per producer and format")
    parser.add_argument("--show", type=int, default=10, help="disagreements to print")
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = main_args()
    corpus_report()
    held_out_report(args.seed, args.size, args.show)
