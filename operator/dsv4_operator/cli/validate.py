"""`dsv4ctl validate`: classify completions from a log file with the strict DSML validator."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from dsv4_engine.cliutil import CommandError
from dsv4_engine.probe.dsml import DsmlFormat
from dsv4_engine.probe.exitcodes import usage_error_exit_3
from dsv4_engine.probe.validate import classify_records


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "validate",
        help="classify tool-call completions from a JSONL file",
        description=(
            "Classify raw completions (one JSON object per line: id, text, optional tools and "
            "echo) as VALID or a corruption class. Exit 0 when all are valid, 1 otherwise, 3 "
            "on unreadable input."
        ),
    )
    parser.add_argument("--format", required=True, choices=[f.value for f in DsmlFormat])
    parser.add_argument("file", type=Path, help="JSONL file, or - for stdin")
    parser.add_argument("--output", choices=["table", "json"], default="table")
    parser.error = usage_error_exit_3(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        text = Path("/dev/stdin").read_text() if str(args.file) == "-" else args.file.read_text()
    except OSError as err:
        raise CommandError(f"cannot read {args.file}: {err.strerror}", 3) from None
    except UnicodeDecodeError:
        raise CommandError(f"{args.file} is not UTF-8 text", 3) from None
    try:
        results = classify_records(text.splitlines(), DsmlFormat(args.format), str(args.file))
    except ValueError as err:
        raise CommandError(str(err), 3) from None
    for record_id, judgement in results:
        if args.output == "json":
            line = {"id": record_id, "valid": judgement.valid, "class": judgement.outcome.value}
            print(json.dumps(line, ensure_ascii=False))
        else:
            print(f"{record_id}\t{judgement.outcome.value}\t{judgement.detail}")
    if args.output == "table":
        counts = Counter(j.outcome.value for _, j in results)
        print("\n".join(f"# {name}: {n}" for name, n in sorted(counts.items())))
    return 0 if all(j.valid for _, j in results) else 1
