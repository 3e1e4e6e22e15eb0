"""The validator on the combined labelled corpus: per-class precision and recall, and speed.

Runs `dsv4ctl validate --format F tests/data/dsml_corpus/corpus_F.jsonl --output json
--score` for each format, as a user would, sums the per-class counts of the three summary
lines and prints the combined table, then the time the validator takes per completion.
"""

from __future__ import annotations

import contextlib
import io
import json
import time
from pathlib import Path

from dsv4_engine.probe.dsml import DsmlFormat
from dsv4_engine.probe.outcome import Outcome
from dsv4_engine.probe.scores import ClassScore, score_table
from dsv4_engine.probe.validate import classify_records
from dsv4_operator.cli.main import main

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "data" / "dsml_corpus"


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


def report() -> None:
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


if __name__ == "__main__":
    report()
