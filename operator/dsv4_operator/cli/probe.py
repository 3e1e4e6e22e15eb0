"""`dsv4ctl probe`: run corruption probes against an engine and print the verdict.

With `--report-configmap` it also files the report where a rollout reads it: this is the
command a rollout's probe Job runs (`probe_args` writes its arguments).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from pydantic import ValidationError

from dsv4_engine.cliutil import CommandError
from dsv4_engine.engine_config import Backend
from dsv4_engine.probe.dsml import DsmlFormat
from dsv4_engine.probe.exitcodes import VERDICT_NOT_FILED, usage_error_exit_3
from dsv4_engine.probe.html_report import render_html
from dsv4_engine.probe.report import summary_table
from dsv4_engine.probe.runner import ProbeConnectionError, Tally, probe
from dsv4_engine.probe.settings import Determinism, ProbeName, ProbeSettings
from dsv4_engine.probe.verdict import Verdict, exercised_needed
from dsv4_operator.cli.kubeapi import connect, default_namespace
from dsv4_operator.reconcile.kube import TRANSIENT_STATUS, ApiError, Kube
from dsv4_operator.rollout.decide import ProbeOutcome
from dsv4_operator.rollout.reports import (
    PROBE_MANAGER,
    Evidence,
    outcome_from_config_map,
    report_filing,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "probe",
        help="probe an engine for output corruption (exit 0 PASS, 1 FAIL, 2 INCONCLUSIVE)",
        description=(
            "Send concurrent requests that exercise prefix reuse, host-tier reloads and long "
            "contexts, judge every answer and decide PASS / FAIL / INCONCLUSIVE with exact "
            "confidence. Exit 0 PASS, 1 FAIL, 2 INCONCLUSIVE, 3 usage or connection error, "
            "4 a verdict that could not be filed in --report-configmap."
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
    p.add_argument(
        "--requests",
        type=int,
        help="judged samples to collect (default: the fewest that can PASS at the rate and "
        "confidence, 598 at 0.5%% and 95%%; the canary's default is the same)",
    )
    p.add_argument("--max-corruption-rate", type=float, default=0.005)
    p.add_argument("--confidence", type=float, default=0.95)
    p.add_argument(
        "--warm-up",
        type=float,
        default=60.0,
        help="seconds the first request (a warm-up, not judged) may keep failing before the "
        "engine counts as not answering (exit 3, or INCONCLUSIVE filed); after it, every "
        "failed request counts as a failure",
    )
    p.add_argument(
        "--max-tokens", type=int, help="tokens of each tool-call answer (default per backend)"
    )
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
    p.add_argument(
        "--hicache",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="the engine runs HiCache: PASS only if enough samples read a prefix back from "
        "its host tier (SGLang's sglext.cached_tokens_details.host > 0; "
        f"{exercised_needed(0.95)} at 95%% confidence)",
    )
    p.add_argument("--report", type=Path, help="write the JSON report here")
    p.add_argument("--html", type=Path, help="write a self-contained HTML report here")
    p.add_argument("--output", choices=["table", "json"], default="table")
    p.add_argument(
        "--report-configmap",
        metavar="NAME",
        help=(
            "also file the report in this ConfigMap, as a rollout reads it (created when "
            "missing; what a rollout's probe Job runs); an unreachable engine is filed as "
            "INCONCLUSIVE (exit 2).  A verdict the ConfigMap holds already stands: the "
            "command exits with it, without probing or overwriting it"
        ),
    )
    p.add_argument(
        "--report-namespace",
        metavar="NS",
        help="namespace of --report-configmap (default: the pod's own, else 'default')",
    )
    p.add_argument("--kubeconfig", help="for --report-configmap (default: like kubectl)")
    p.error = usage_error_exit_3(p)
    p.set_defaults(func=run)


# ProbeSettings field → its command-line option (the `dest` is the option with `_`).
OPTIONS: dict[str, str] = {
    "backend": "backend",
    "model": "model",
    "format": "format",
    "concurrency": "concurrency",
    "requests": "requests",
    "max_corruption_rate": "max-corruption-rate",
    "confidence": "confidence",
    "warm_up_s": "warm-up",
    "max_tokens": "max-tokens",
    "request_timeout_s": "timeout",
    "max_duration_s": "max-duration",
    "prefix_words": "prefix-words",
    "sessions_per_prefix": "sessions-per-prefix",
    "long_context_words": "long-context-words",
    "seed": "seed",
    "deterministic": "deterministic",
    "hicache": "hicache",
}
# Not on the command line: a Job cannot be told them, so `probe_args` refuses them.
NOT_OPTIONS = ("consistency_max_tokens", "connect_timeout_s", "api_key")
NO_OFFLOAD = "none"


def _settings(args: argparse.Namespace) -> ProbeSettings:
    probes = []
    for name in filter(None, (args.probes or "").split(",")):
        try:
            probes.append(ProbeName(name.strip()))
        except ValueError:
            valid = ", ".join(p.value for p in ProbeName)
            raise CommandError(f"--probes: unknown probe {name!r} (one of {valid})", 3) from None
    offload = None if args.admin_offload_path == NO_OFFLOAD else args.admin_offload_path
    fields = {field: getattr(args, option.replace("-", "_")) for field, option in OPTIONS.items()}
    try:
        return ProbeSettings(
            base_url=args.url, probes=tuple(probes), admin_offload_path=offload, **fields
        )
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(map(str, first["loc"])) or "settings"
        option = {"base_url": "url", **OPTIONS}.get(field, field.replace("_", "-"))
        raise CommandError(f"--{option}: {first['msg']}", 3) from None


def probe_args(settings: ProbeSettings) -> list[str]:
    """The `dsv4ctl probe` arguments that parse back to ``settings``: a probe Job's command.

    Every option is spelled out, defaults included, so the Job shows exactly what it runs.
    """
    defaults = ProbeSettings(base_url=settings.base_url)
    unsupported = [f for f in NOT_OPTIONS if getattr(settings, f) != getattr(defaults, f)]
    if unsupported:
        raise ValueError(f"dsv4ctl probe has no option for {', '.join(unsupported)}")
    args = [settings.base_url]
    if settings.probes:
        args += ["--probes", ",".join(p.value for p in settings.probes)]
    offload = settings.admin_offload_path
    args += ["--admin-offload-path", NO_OFFLOAD if offload is None else offload]
    for field, option in OPTIONS.items():
        value = getattr(settings, field)
        if isinstance(value, bool):  # a switch: --option or --no-option
            args.append(f"--{option}" if value else f"--no-{option}")
        elif value is not None:
            args += [f"--{option}", str(value.value if isinstance(value, Enum) else value)]
    return args


def _progress_bar(tally: Tally) -> None:
    done = len(tally.samples)
    filled = int(30 * done / tally.budget)
    sys.stderr.write(
        f"\r[{'#' * filled}{'.' * (30 - filled)}] {done}/{tally.budget} "
        f"corrupt {tally.corrupt} failed requests {tally.transport_errors} "
    )
    sys.stderr.flush()


def run(args: argparse.Namespace) -> int:
    settings = _settings(args)
    # Connect before probing: a bad kubeconfig must not cost a whole probe run.
    filing = _Filing.connect(args) if args.report_configmap else None
    if filing is not None and (earlier := filing.filed()) is not None:
        # An earlier run of this attempt (a pod retried, evicted, or its Job recreated)
        # filed a verdict: it stands, and probing again could only replace it.
        print(f"{filing} already holds {earlier.verdict.value}; not probing again", file=sys.stderr)
        return _exit_code(earlier)
    tty = sys.stderr.isatty()
    try:
        result = probe(settings, _progress_bar if tty else None)
    except ProbeConnectionError as err:
        if filing is None:
            raise CommandError(str(err), 3) from None
        unreachable = Evidence.unreachable(filing.name, settings, err)
        standing = filing.file(unreachable) or unreachable.outcome
        print(f"{err}: {standing.verdict.value} in {filing}", file=sys.stderr)
        return _exit_code(standing)
    finally:
        if tty:
            sys.stderr.write("\n")
    evidence = Evidence.of(args.report_configmap or "", result)
    report = evidence.body
    try:
        if args.report:
            args.report.write_text(json.dumps(report, indent=2) + "\n")
        if args.html:
            args.html.write_text(render_html(report))
    except OSError as err:
        raise CommandError(f"cannot write report: {err}", 3) from None
    standing = filing.file(evidence) if filing is not None else None
    print(json.dumps(report, indent=2) if args.output == "json" else summary_table(report))
    if standing is not None:
        print(f"{filing} already held {standing.verdict.value}, which stands", file=sys.stderr)
        return _exit_code(standing)
    return result.exit_code


def _exit_code(outcome: ProbeOutcome) -> int:
    """The exit code of the verdict a report holds."""
    exits = {verdict.value: verdict.exit_code for verdict in Verdict}
    return exits.get(outcome.verdict.value, Verdict.INCONCLUSIVE.exit_code)


# Pauses between tries to file a verdict while the API server fails (each try already
# retries transient errors briefly, `reconcile.kube.retrying`); after the last the verdict
# is given up as not filed (exit 4, which a probe Job does not retry).
FILING_PAUSES_S = (2.0, 4.0, 8.0, 16.0)


@dataclass(frozen=True)
class _Filing:
    """Where `--report-configmap` files the report, and the API client to do it with."""

    kube: Kube
    namespace: str
    name: str

    @classmethod
    def connect(cls, args: argparse.Namespace) -> _Filing:
        namespace = args.report_namespace or default_namespace()
        return cls(connect(args.kubeconfig, exit_code=3), namespace, args.report_configmap)

    def __str__(self) -> str:
        return f"configmap {self.namespace}/{self.name}"

    def filed(self) -> ProbeOutcome | None:
        """The verdict the report holds already, if any."""
        try:
            config_map = self.kube.get("ConfigMap", self.namespace, self.name)
        except ApiError as err:
            raise CommandError(f"cannot read the report in {self}: {err}", 3) from None
        return outcome_from_config_map(config_map) if config_map else None

    def file(self, evidence: Evidence) -> ProbeOutcome | None:
        """File the verdict, unless the report holds one already: that one stands and is
        returned (None: filed).  Server-side apply of the verdict and data only, under the
        probe's own field manager (the labels and owner the operator gave the ConfigMap stay
        as they are), with the resourceVersion just read as its precondition, so a verdict
        another run filed meanwhile is never overwritten."""
        error: ApiError | None = None
        for pause in (*FILING_PAUSES_S, None):
            try:
                config_map = self.kube.get("ConfigMap", self.namespace, self.name)
                standing = outcome_from_config_map(config_map) if config_map else None
                if standing is not None:
                    return standing
                body = report_filing(evidence)
                body["metadata"].update(name=self.name, namespace=self.namespace)
                if config_map is not None:
                    body["metadata"]["resourceVersion"] = config_map["metadata"]["resourceVersion"]
                self.kube.apply(
                    {"apiVersion": "v1", "kind": "ConfigMap", **body}, manager=PROBE_MANAGER
                )
                return None
            except ApiError as err:
                if err.status != 409 and err.status not in TRANSIENT_STATUS:
                    raise CommandError(
                        f"cannot file the report in {self}: {err}", VERDICT_NOT_FILED
                    ) from None
                error = err
            if pause is not None:
                time.sleep(pause)
        raise CommandError(f"cannot file the report in {self}: {error}", VERDICT_NOT_FILED)
