"""`dsv4ctl probe`: run corruption probes against an engine and print the verdict."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pydantic import ValidationError

from dsv4_engine.cliutil import CommandError
from dsv4_engine.engine_config import Backend
from dsv4_engine.probe.dsml import DsmlFormat
from dsv4_engine.probe.exitcodes import usage_error_exit_3
from dsv4_engine.probe.html_report import render_html
from dsv4_engine.probe.report import build_report, summary_table
from dsv4_engine.probe.runner import ProbeConnectionError, Tally, probe
from dsv4_engine.probe.settings import Determinism, ProbeName, ProbeSettings


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "probe",
        help="probe an engine for output corruption (exit 0 PASS, 1 FAIL, 2 INCONCLUSIVE)",
        description=(
            "Send concurrent requests that exercise prefix reuse, host-tier reloads and long "
            "contexts, judge every answer and decide PASS / FAIL / INCONCLUSIVE with exact "
            "confidence. Exit 0 PASS, 1 FAIL, 2 INCONCLUSIVE, 3 usage or connection error."
        ),
    )
    p.add_argument("url", help="engine or router base URL, e.g. http://127.0.0.1:30000")
    p.add_argument("--backend", choices=[b.value for b in Backend], default="sglang")
    p.add_argument("--model", help="model name (default: first of GET /v1/models)")
    p.add_argument(
        "--probes",
        help=f"comma-separated probe set (default per backend): {', '.join(p.value for p in ProbeName)}",
    )
    p.add_argument("--format", choices=[f.value for f in DsmlFormat], default="v4")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--requests", type=int, help="samples at most (default: enough to PASS)")
    p.add_argument("--max-corruption-rate", type=float, default=0.005)
    p.add_argument("--confidence", type=float, default=0.95)
    p.add_argument("--max-transport-error-rate", type=float, default=0.02)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    p.add_argument("--max-duration", type=float, help="seconds; stop starting samples after")
    p.add_argument("--prefix-words", type=int, help="shared prefix length (default per backend)")
    p.add_argument("--sessions-per-prefix", type=int, default=8)
    p.add_argument(
        "--long-context-words",
        type=int,
        help="long-context prompt length, > index_topk x compress ratio tokens (default per backend)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deterministic", choices=[d.value for d in Determinism], default="auto")
    p.add_argument(
        "--admin-offload-path",
        default="default",
        help="POST path pushing cached prefixes to the host tier ('none' to skip)",
    )
    p.add_argument("--report", type=Path, help="write the JSON report here")
    p.add_argument("--html", type=Path, help="write a self-contained HTML report here")
    p.add_argument("--output", choices=["table", "json"], default="table")
    p.error = usage_error_exit_3(p)
    p.set_defaults(func=run)


def _settings(args: argparse.Namespace) -> ProbeSettings:
    probes = []
    for name in filter(None, (args.probes or "").split(",")):
        try:
            probes.append(ProbeName(name.strip()))
        except ValueError:
            valid = ", ".join(p.value for p in ProbeName)
            raise CommandError(f"--probes: unknown probe {name!r} (one of {valid})", 3) from None
    try:
        return ProbeSettings(
            base_url=args.url,
            backend=args.backend,
            model=args.model,
            probes=tuple(probes),
            format=args.format,
            concurrency=args.concurrency,
            requests=args.requests,
            max_corruption_rate=args.max_corruption_rate,
            confidence=args.confidence,
            max_transport_error_rate=args.max_transport_error_rate,
            max_tokens=args.max_tokens,
            request_timeout_s=args.timeout,
            seed=args.seed,
            max_duration_s=args.max_duration,
            prefix_words=args.prefix_words,
            sessions_per_prefix=args.sessions_per_prefix,
            long_context_words=args.long_context_words,
            deterministic=args.deterministic,
            admin_offload_path=None
            if args.admin_offload_path == "none"
            else args.admin_offload_path,
        )
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(map(str, first["loc"])) or "settings"
        renamed = {
            "base_url": "url",
            "request_timeout_s": "timeout",
            "max_duration_s": "max-duration",
        }
        option = renamed.get(field, field)
        raise CommandError(f"--{option.replace('_', '-')}: {first['msg']}", 3) from None


def _progress_bar(tally: Tally) -> None:
    done = len(tally.samples)
    filled = int(30 * done / tally.budget)
    sys.stderr.write(
        f"\r[{'#' * filled}{'.' * (30 - filled)}] {done}/{tally.budget} "
        f"corrupt {tally.corrupt} errors {tally.transport_errors} "
    )
    sys.stderr.flush()


def run(args: argparse.Namespace) -> int:
    settings = _settings(args)
    tty = sys.stderr.isatty()
    try:
        result = probe(settings, _progress_bar if tty else None)
    except ProbeConnectionError as err:
        raise CommandError(str(err), 3) from None
    finally:
        if tty:
            sys.stderr.write("\n")
    report = build_report(result)
    try:
        if args.report:
            args.report.write_text(json.dumps(report, indent=2) + "\n")
        if args.html:
            args.html.write_text(render_html(report))
    except OSError as err:
        raise CommandError(f"cannot write report: {err}", 3) from None
    print(json.dumps(report, indent=2) if args.output == "json" else summary_table(report))
    return result.exit_code
