"""`dsv4ctl probe`: run corruption probes against an engine and print the verdict.

With `--report-configmap` it also files the report where a rollout reads it: this is the
command a rollout's probe Job runs.  The options that set the probe's settings are
`dsv4_engine.probe.args`, which also writes a Job's arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from dsv4_engine.cliutil import CommandError
from dsv4_engine.probe.args import add_arguments, settings_from
from dsv4_engine.probe.exitcodes import VERDICT_NOT_FILED, usage_error_exit_3
from dsv4_engine.probe.html_report import render_html
from dsv4_engine.probe.report import summary_table
from dsv4_engine.probe.runner import ProbeConnectionError, Tally, probe
from dsv4_engine.probe.verdict import Verdict
from dsv4_operator.cli.kubeapi import connect, default_namespace
from dsv4_operator.kube.client import TRANSIENT_STATUS, ApiError, Kube
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
    add_arguments(p)
    p.add_argument("--report", type=Path, help="write the JSON report here")
    p.add_argument("--html", type=Path, help="write a self-contained HTML report here")
    p.add_argument("--output", choices=["table", "json"], default="table")
    p.add_argument(
        "--report-configmap",
        metavar="NAME",
        help=(
            "also file the report in this ConfigMap, as a rollout reads it (what a "
            "rollout's probe Job runs: the operator creates the ConfigMap first); an "
            "unreachable engine is filed as INCONCLUSIVE (exit 2).  A verdict the ConfigMap "
            "holds before the probe files its own is evidence this run did not produce: "
            "the command neither repeats nor overwrites it, and exits 1 (FAIL)"
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


def _progress_bar(tally: Tally) -> None:
    done = len(tally.samples)
    filled = int(30 * done / tally.budget)
    sys.stderr.write(
        f"\r[{'#' * filled}{'.' * (30 - filled)}] {done}/{tally.budget} "
        f"corrupt {tally.corrupt} failed requests {tally.transport_errors} "
    )
    sys.stderr.flush()


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    # Connect before probing: a bad kubeconfig must not cost a whole probe run.
    filing = _Filing.connect(args) if args.report_configmap else None
    if filing is not None and (earlier := filing.filed()) is not None:
        # Whoever filed it (another pod of this attempt, or not), this run did not: a
        # verdict there before the probe ran is no evidence of it, and repeating it would
        # vouch for it.  The attempt FAILs (the operator trusts no PASS from a failed Job).
        print(
            f"evidence existed before the run: {filing} already holds "
            f"{earlier.verdict.value}; not probing, not repeating it: FAIL",
            file=sys.stderr,
        )
        return Verdict.FAIL.exit_code
    tty = sys.stderr.isatty()
    try:
        result = probe(settings, _progress_bar if tty else None)
    except ProbeConnectionError as err:
        if filing is None:
            raise CommandError(str(err), 3) from None
        unreachable = Evidence.unreachable(filing.name, settings, err)
        if (standing := filing.file(unreachable)) is not None:
            return _not_ours(filing, standing)
        print(f"{err}: INCONCLUSIVE in {filing}", file=sys.stderr)
        return Verdict.INCONCLUSIVE.exit_code
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
    if filing is not None and standing is not None:
        return _not_ours(filing, standing)
    return result.exit_code


def _not_ours(filing: _Filing, standing: ProbeOutcome) -> int:
    """Someone filed a verdict while this run probed: not this run's evidence, and it
    cannot be replaced (a filed verdict stands): the attempt FAILs."""
    print(
        f"{filing} was filed ({standing.verdict.value}) by someone else during this run: "
        "that is not this run's evidence, and this one cannot replace it: FAIL",
        file=sys.stderr,
    )
    return Verdict.FAIL.exit_code


# Pauses between tries to file a verdict while the API server fails (each try already
# retries transient errors briefly, `kube.client.retrying`); after the last the verdict
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
        """File the verdict, unless the report holds one already: that one is returned
        (None: filed), and never overwritten.  Server-side apply of the verdict and data only, under the
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
