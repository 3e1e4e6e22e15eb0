"""The validator on the combined labelled corpus, and on held-out completions it has never seen.

First the corpus: runs `dsv4ctl validate --format F tests/data/dsml_corpus/corpus_F.jsonl
--output json --score` for each format, as a user would, sums the per-class counts of the
three summary lines and prints the combined table; then, per production shape the corpus
marks (`shape`, see make_corpus.SHAPES), the recall on the corrupt shapes (loops, invoke
cycles, U+FFFD runs, role tokens, foreign dialects) and the false alarms on the valid
guards (repetitive values, parallel calls, multilingual text), and the false alarms on the
whole valid corpus; then the time the validator takes per completion, and its throughput
on long answers (8k to 32k characters: markdown prose, a CSV value, a log value, a loop
that runs into max_tokens), the size the engine judges on every production tool-call answer.

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
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from dsv4_engine.probe.context import RequestContext
from dsv4_engine.probe.dsml import DsmlFormat
from dsv4_engine.probe.outcome import Judgement, Outcome
from dsv4_engine.probe.scores import ClassScore, score, score_table
from dsv4_engine.probe.validate import Judged, classify_completion, classify_records
from dsv4_operator.cli.main import main
from tests.unit.probe.encoders import render
from tests.unit.probe.producers import PRODUCERS, Case, held_out, validators

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
    shapes_report(judged_corpus(lines))
    start = time.perf_counter()
    rounds = 20
    for _ in range(rounds):
        for fmt, records in lines.items():
            classify_records(records, fmt, fmt.value)
    per = (time.perf_counter() - start) / (rounds * total)
    print(f"validator: {per * 1e6:.0f} µs per completion (a tool set is compiled once)")


def judged_corpus(lines: dict[DsmlFormat, list[str]]) -> list[tuple[dict, Judged]]:
    """Every corpus record with the validator's verdict on it."""
    return [
        (json.loads(line), judged)
        for fmt, records in lines.items()
        for line, judged in zip(records, classify_records(records, fmt, fmt.value), strict=True)
    ]


def shapes_report(judged: Sequence[tuple[dict, Judged]]) -> None:
    """Per shape: recall where the shape is corruption, false alarms where it is valid; then
    the false alarms on the whole valid corpus."""
    print("\nproduction shapes (corpus):")
    valid = {row["shape"]: row["label"] == Outcome.VALID for row, _ in judged if "shape" in row}
    for shape in sorted(valid, key=lambda shape: (valid[shape], shape)):  # corrupt first
        rows = [(row, j) for row, j in judged if row.get("shape") == shape]
        right = sum(j.judgement.outcome == row["label"] for row, j in rows)
        if valid[shape]:
            print(f"  {shape:<18} valid:   {len(rows) - right} false alarms in {len(rows)}")
        else:
            print(f"  {shape:<18} corrupt: recall {right}/{len(rows)} = {right / len(rows):.1%}")
    labelled_valid = [(row, j) for row, j in judged if row["label"] == Outcome.VALID]
    alarms = [row["id"] for row, j in labelled_valid if not j.judgement.valid]
    print(f"false alarms on the valid corpus: {len(alarms)} of {len(labelled_valid)}", *alarms)


LONG_SIZES = (8_000, 16_000, 32_000)
WRITE_TOOL = {
    "type": "function",
    "function": {
        "name": "write_file",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    },
}


def long_answers(size: int) -> dict[str, str]:
    """Answers of `size` characters the engine may judge: the project's own docs as
    markdown prose (tables, code, lists), a CSV file and a log written by a call (rows
    alike but for their numbers: the slowest legitimate shape for the loop search), and
    prose that falls into a loop until max_tokens."""
    docs = "\n\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    csv = "".join(
        f"2025-03-{d % 28 + 1:02d},{d},{1000 + 37 * d % 211},{d % 3}\n" for d in range(size)
    )
    log = "".join(
        f"10:{d // 60 % 60:02d}:{d % 60:02d} INFO replica {d % 3} ok\n" for d in range(size)
    )
    loop = docs[: size // 2] + ("I will check the weather for you now. " * size)[: size // 2]
    return {
        "markdown prose": render(DsmlFormat.V4, [WRITE_TOOL], [], docs[:size]),
        "CSV value": _written(csv[: size - 300]),
        "log value": _written(log[: size - 300]),
        "loop to max_tokens": loop,
    }


def _written(content: str) -> str:
    call = ("write_file", {"path": "data/out.txt", "content": content})
    return render(DsmlFormat.V4, [WRITE_TOOL], [call], "Writing the file.")


def long_output_report() -> None:
    """The validator's time per long answer, judged as the engine judges it: no echo, the
    request known.  The median of 21 runs: this machine may be shared."""
    print("\nlong answers (no echo, prompt known), median of 21 runs:")
    context = RequestContext.of("Save March's counts and summarize the docs.", [WRITE_TOOL])
    tools = validators([WRITE_TOOL])
    for size in LONG_SIZES:
        for name, text in long_answers(size).items():
            times = []
            for _ in range(21):
                start = time.perf_counter()
                judged = classify_completion(text, DsmlFormat.V4, tools, None, context)
                times.append(time.perf_counter() - start)
            per = statistics.median(times)
            print(
                f"  {len(text):>6} chars  {name:<18} {per * 1e3:6.2f} ms  "
                f"{len(text) / per / 1e6:5.1f} M chars/s  {judged.outcome}"
            )


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
    long_output_report()
    held_out_report(args.seed, args.size, args.show)
