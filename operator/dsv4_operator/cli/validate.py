"""`dsv4ctl validate`: classify completions from a log file with the strict DSML validator."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from dsv4_engine.cliutil import CommandError
from dsv4_engine.probe.dsml import DsmlFormat
from dsv4_engine.probe.exitcodes import usage_error_exit_3
from dsv4_engine.probe.scores import score, score_table
from dsv4_engine.probe.validate import Judged, judge_jsonl


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "validate",
        help="classify tool-call completions from a JSONL file",
        description=(
            "Classify raw completions (one JSON object per line: id, text, optional tools, "
            "echo, prompt and label) as VALID or a corruption class. Exit 0 when all are "
            "valid, 1 otherwise, 3 on unreadable input. A malformed record is named on "
            "stderr with its line number, the others are still judged, and the exit is 3."
        ),
    )
    parser.add_argument("--format", required=True, choices=[f.value for f in DsmlFormat])
    parser.add_argument("file", type=Path, help="JSONL file, or - for stdin")
    parser.add_argument("--output", choices=["table", "json"], default="table")
    parser.add_argument(
        "--score",
        action="store_true",
        help="compare each record's label with its verdict: per-class precision and recall",
    )
    parser.error = usage_error_exit_3(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        text = Path("/dev/stdin").read_text() if str(args.file) == "-" else args.file.read_text()
    except OSError as err:
        raise CommandError(f"cannot read {args.file}: {err.strerror}", 3) from None
    except UnicodeDecodeError:
        raise CommandError(f"{args.file} is not UTF-8 text", 3) from None
    results, malformed = judge_jsonl(text, DsmlFormat(args.format), str(args.file))
    if args.score and (unlabelled := [r.id for r in results if r.label is None]):
        raise CommandError(f"--score: record {unlabelled[0]!r} has no field 'label'", 3)
    if args.output == "json":
        _print_json(results, args.score)
    else:
        _print_table(results, args.score)
    for message in malformed:
        print(f"dsv4ctl validate: {message}", file=sys.stderr)
    if malformed:
        return 3
    return 0 if all(r.judgement.valid for r in results) else 1


def _print_json(results: list[Judged], scored: bool) -> None:
    for r in results:
        j = r.judgement
        line = {"id": r.id, "valid": j.valid, "class": j.outcome.value, "detail": j.detail}
        print(json.dumps(line, ensure_ascii=False))
    summary: dict = {"total": len(results), "counts": _counts(results)}
    if scored:
        summary["scores"] = {
            s.outcome.value: {"labelled": s.labelled, "judged": s.judged, "correct": s.correct}
            for s in score((r.label, r.judgement.outcome) for r in results)
        }
    print(json.dumps({"summary": summary}))


def _print_table(results: list[Judged], scored: bool) -> None:
    for r in results:
        print(f"{r.id}\t{r.judgement.outcome.value}\t{r.judgement.detail}")
    print("\n".join(f"# {name}: {n}" for name, n in _counts(results).items()))
    if scored:
        print(score_table(score((r.label, r.judgement.outcome) for r in results)))


def _counts(results: list[Judged]) -> dict[str, int]:
    return dict(sorted(Counter(r.judgement.outcome.value for r in results).items()))
