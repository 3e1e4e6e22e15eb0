"""`dsv4ctl rollout status|report|promote|abort|retry|undo NAME`: see and steer a canary rollout.

Also installed as the kubectl plugin `kubectl-dsv4`, so `kubectl dsv4 rollout status NAME`
works.  Controls are an annotation the operator reads (dsv4_operator.rollout.manual); the
report is the ConfigMap that status.rollout.report names.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from typing import Any

from dsv4_engine.cliutil import CommandError
from dsv4_engine.probe.stats import percents
from dsv4_operator.api import KIND
from dsv4_operator.api.rollout import IN_PROGRESS, CanarySpec
from dsv4_operator.cli import undo
from dsv4_operator.cli.dashboard import ENV, dashboard_url, grafana_base
from dsv4_operator.cli.kubeapi import connect, whoami
from dsv4_operator.kube.client import path
from dsv4_operator.rollout.decide import ManualAction
from dsv4_operator.rollout.manual import annotations
from dsv4_operator.rollout.reports import REPORT_KEY


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "rollout",
        help="show or steer the canary rollout of a DSV4Deployment",
        description="Show or steer the feature-flag rollout of a DSV4Deployment.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, text in (
        ("status", "phase, revisions, verdict and evidence"),
        ("report", "print the canary report (summary table, or --output json)"),
        ("promote", "promote the canary's flags without waiting for a verdict"),
        ("abort", "stop the rollout and keep the stable flags (the flags are rejected)"),
        ("retry", "test flags that a failed canary rejected once more"),
        ("undo", "return production to flags that served before (no canary: they were proven)"),
    ):
        sub = actions.add_parser(name, help=text)
        sub.add_argument("name", help="the DSV4Deployment")
        sub.add_argument("-n", "--namespace", default="default")
        sub.add_argument("--kubeconfig", default=None, help="default: $KUBECONFIG")
        if name in ("status", "report"):
            sub.add_argument(
                "--grafana-url",
                default=None,
                help=f"Grafana's URL, to print a link to the deployment's dashboard around "
                f"the rollout (default: ${ENV}; none: no link)",
            )
        if name == "status":
            sub.add_argument("--output", choices=("table", "json"), default="table")
        if name == "undo":
            sub.add_argument(
                "--to-revision",
                default=None,
                metavar="R",
                help="the revision to return to (default: the newest that served before and "
                "may be returned to; `dsv4ctl rollout status` lists the history)",
            )
            sub.add_argument(
                "--print-patch",
                action="store_true",
                help="print the spec edit the undo makes (a JSON merge patch) and write "
                "nothing: what a GitOps repository must hold too",
            )
        if name == "report":
            sub.add_argument(
                "--output",
                choices=("table", "json", "html"),
                default="table",
                help="html: the probe's self-contained HTML page (as `dsv4ctl probe --html`)",
            )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    kube = connect(args.kubeconfig)
    obj = kube.get(KIND, args.namespace, args.name)
    if obj is None:
        raise CommandError(f"DSV4Deployment {args.namespace}/{args.name} not found", exit_code=1)
    rollout = (obj.get("status") or {}).get("rollout")
    if args.action in ("status", "report"):
        base = grafana_base(args.grafana_url)
        link = base and dashboard_url(
            base, args.namespace, args.name, rollout or {}, dt.datetime.now(dt.UTC)
        )
    if args.action == "status":
        canary = (obj.get("spec") or {}).get("canary") or {}
        budget = canary.get(
            "maxCorruptionRate", CanarySpec.model_fields["max_corruption_rate"].default
        )
        return _status(rollout, args.output, float(budget), link)
    if args.action == "report":
        return _report(kube, args.namespace, rollout, args.output, link)
    if args.action == "undo":
        return undo.run(kube, obj, args.to_revision, args.print_patch)
    action = ManualAction(args.action)
    revision = target_revision(action, rollout or {})
    control = annotations(action, str(time.time_ns()), revision, whoami(kube))
    kube.request(
        "PATCH",
        path(KIND, args.namespace, args.name),
        body={"metadata": {"annotations": control}},
        content_type="application/merge-patch+json",
    )
    print(f"{args.namespace}/{args.name}: {action.value} of flags {revision} requested")
    return 0


def target_revision(action: ManualAction, rollout: dict[str, Any]) -> str:
    """The flags a control is for, as the status shows them now: the operator refuses the
    control if its rollout has moved on by the time it reads it."""
    if action is ManualAction.RETRY:
        rejected = rollout.get("rejectedRevision")
        if rollout.get("phase") != "RolledBack" or not rejected:
            raise CommandError("nothing to retry: no flags are rejected", exit_code=1)
        return str(rejected)
    if rollout.get("phase") not in {phase.value for phase in IN_PROGRESS}:
        raise CommandError(
            f"nothing to {action.value}: no rollout in progress (phase {rollout.get('phase')})",
            exit_code=1,
        )
    return str(rollout["canaryRevision"])


def _status(rollout: dict[str, Any] | None, output: str, budget: float, link: str | None) -> int:
    if output == "json":
        print(json.dumps(rollout or {}, indent=2))
        return 0
    if not rollout:
        print("no rollout recorded yet (the operator has not reconciled this resource)")
        return 0
    rows = [
        ("phase", rollout.get("phase")),
        ("stable revision", rollout.get("stableRevision")),
        ("canary revision", rollout.get("canaryRevision")),
        ("started", rollout.get("startedAt")),
        ("verdict", rollout.get("verdict")),
        ("corruption rate", _pct(rollout.get("rate"))),
        ("upper bound", _bound(rollout.get("bound"), budget)),
        ("samples", rollout.get("samples")),
        ("report", rollout.get("report")),
        ("why", rollout.get("verdictReason")),
        ("rejected revision", rollout.get("rejectedRevision")),
        ("production watch", _watch(rollout.get("stableProbe"))),
        *_history(rollout.get("history") or []),
        ("message", rollout.get("message")),
        ("dashboard", link),
    ]
    for label, value in rows:
        if value not in (None, ""):
            print(f"{label:<18} {value}")
    return 0


def _report(
    kube: Any, namespace: str, rollout: dict[str, Any] | None, output: str, link: str | None
) -> int:
    """The report the rollout names, as a table (with the dashboard ``link``, if any), its
    JSON, or the HTML page; the JSON is the report exactly as filed."""
    rollout = rollout or {}
    name = rollout.get("report")
    if not name and rollout.get("verdict"):
        # Decided before any probe ran (the canary could not be placed or never became
        # Ready, a person aborted): the status holds the whole story.
        why = rollout.get("verdictReason") or rollout.get("message")
        decided = {"verdict": rollout["verdict"], "probed": False, "why": why}
        if output == "json":
            print(json.dumps(decided, indent=2))
        else:
            print(f"verdict  {decided['verdict']} (no probe ran)\nwhy      {decided['why']}")
            _print_link(link)
        return 0
    if not name:
        raise CommandError("no canary report yet: the rollout has not reached a verdict", 1)
    config_map = kube.get("ConfigMap", namespace, name)
    if config_map is None or REPORT_KEY not in (config_map.get("data") or {}):
        raise CommandError(f"report ConfigMap {namespace}/{name} is missing", exit_code=1)
    report = json.loads(config_map["data"][REPORT_KEY])
    if output == "json":
        print(json.dumps(report, indent=2))
    elif output == "html":
        if "samples" not in report:
            verdict = report.get("verdict")
            raise CommandError(
                f"report {name} has no probe samples for an HTML page (verdict {verdict}); "
                "--output table says why",
                exit_code=1,
            )
        from dsv4_engine.probe.html_report import render_html

        print(render_html(report))
    else:
        print(_table(report))
        print(
            f"\nJSON: kubectl get configmap {name} -n {namespace} -o jsonpath='{{.data.report\\.json}}'"
        )
        _print_link(link)
    return 0


def _print_link(link: str | None) -> None:
    if link:
        print(f"dashboard: {link}")


def _table(report: dict[str, Any]) -> str:
    if "samples" not in report:
        # No probe ran (the canary was unreachable, a probe Job filed nothing): only why.
        lines = [f"verdict  {report.get('verdict')}", f"target   {report.get('base_url')}"]
        return "\n".join([*lines, *(f"- {reason}" for reason in report.get("reasons", []))])
    from dsv4_engine.probe import summary_table

    return summary_table(report)


def _history(history: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """One row per revision that served, newest first: what `undo` can return to."""
    rows = []
    for i, entry in enumerate(history):
        flags = entry.get("flags") or {}
        image = flags.get("imageDigest") or (flags.get("spec") or {}).get("image", {}).get("name")
        how = entry.get("verdict") or "adopted at creation"
        until = entry.get("retiredAt") or "now"
        watched = f"{entry.get('watchRuns', 0)} clean watch runs"
        if entry.get("corruption"):
            watched = f"CORRUPTION FOUND: {entry['corruption']}"
        text = f"{how}, served {entry.get('promotedAt')} - {until}, {image}; {watched}"
        rows.append(("history" if i == 0 else "", text))
    return rows


def _watch(watch: dict[str, Any] | None) -> str | None:
    if not watch:
        return None
    found = watch.get("verdict") or "running"
    return f"{found} (started {watch.get('startedAt')}, {watch.get('samples', 0)} samples)"


def _pct(value: float | None) -> str | None:
    return None if value is None else f"{value:.3%}"


def _bound(value: float | None, budget: float) -> str | None:
    """The bound beside the spec's budget, in as many digits as tell them apart."""
    if value is None:
        return None
    shown, limit = percents(value, budget)
    return f"{shown} (budget {limit})"
