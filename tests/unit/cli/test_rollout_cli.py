"""`dsv4ctl rollout promote|abort|retry`: the request the operator acts on; `report`'s HTML page."""

import asyncio
import datetime as dt
import json
from urllib.parse import parse_qs, urlsplit

import pytest

from dsv4_engine.probe import ProbeName, ProbeSettings, build_report, run_probes
from dsv4_engine.probe.html_report import render_html
from dsv4_engine.probe.scripted_server import ScriptedCompletionServer
from dsv4_operator.cli import rollout as rollout_cli
from dsv4_operator.cli.kubeapi import SELF_SUBJECT_REVIEWS
from dsv4_operator.cli.main import main
from dsv4_operator.rollout.decide import ManualAction
from dsv4_operator.rollout.manual import parse
from dsv4_operator.rollout.reports import REPORT_KEY


class PatchRecordingKube:
    def __init__(self, rollout):
        self.requests = []
        self.rollout = rollout

    def get(self, kind, namespace, name):
        return {
            "metadata": {"name": name, "namespace": namespace},
            "status": {"rollout": self.rollout},
        }

    def request(self, method, url_path, body=None, content_type="application/json", query=None):
        if url_path == SELF_SUBJECT_REVIEWS:  # who these credentials are: read, not written
            return {"status": {"userInfo": {"username": "alice"}}}
        self.requests.append((method, url_path, body, content_type))
        return None


PROBING = {"phase": "Probing", "canaryRevision": "c0ffee1234", "stableRevision": "aaaa"}
ROLLED_BACK = {
    "phase": "RolledBack",
    "canaryRevision": "c0ffee1234",
    "rejectedRevision": "c0ffee1234",
}


@pytest.mark.parametrize(
    ("action", "rollout"),
    [
        ("promote", PROBING),
        ("abort", PROBING),
        ("retry", ROLLED_BACK),
        ("promote", {**PROBING, "phase": "CanaryPending"}),  # waiting for capacity: in progress
    ],
)
def test_a_control_is_a_merge_patch_of_the_annotation_the_operator_reads(
    action, rollout, monkeypatch, capsys
):
    kube = PatchRecordingKube(rollout)
    monkeypatch.setattr(rollout_cli, "connect", lambda kubeconfig: kube)
    assert main(["rollout", action, "flash", "-n", "serving"]) == 0
    ((method, url, body, content_type),) = kube.requests
    assert (method, content_type) == ("PATCH", "application/merge-patch+json")
    assert url == "/apis/inference.dsv4.dev/v1alpha1/namespaces/serving/dsv4deployments/flash"
    manual = parse(body["metadata"]["annotations"])
    assert manual is not None and manual.action is ManualAction(action) and manual.token
    # Bound to the flags the status shows: a control cannot act on a later rollout.
    assert manual.revision == "c0ffee1234"
    assert manual.by == "alice", "who asked: the user the API server authenticated"
    assert capsys.readouterr().out == f"serving/flash: {action} of flags c0ffee1234 requested\n"


@pytest.mark.parametrize(
    ("action", "rollout", "why"),
    [
        ("promote", {"phase": "Idle"}, "nothing to promote: no rollout in progress (phase Idle)"),
        ("abort", {"phase": "RolledBack"}, "nothing to abort: no rollout in progress"),
        ("retry", PROBING, "nothing to retry: no flags are rejected"),
    ],
)
def test_a_control_with_nothing_to_act_on_is_refused_before_any_write(
    action, rollout, why, monkeypatch, capsys
):
    kube = PatchRecordingKube(rollout)
    monkeypatch.setattr(rollout_cli, "connect", lambda kubeconfig: kube)
    assert main(["rollout", action, "flash", "-n", "serving"]) == 1
    assert kube.requests == []
    assert why in capsys.readouterr().err


class ReportKube(PatchRecordingKube):
    """A DSV4Deployment whose rollout names a report ConfigMap holding ``report``."""

    def __init__(self, report):
        super().__init__({"phase": "Idle", "verdict": "PASS", "report": "flash-report-1"})
        self.report = report

    def get(self, kind, namespace, name):
        if kind == "ConfigMap":
            return {"data": {REPORT_KEY: json.dumps(self.report)}}
        return super().get(kind, namespace, name)


async def _probed_report() -> dict:
    server = ScriptedCompletionServer(corruption_rate=0.0, latency_s=0.001, seed=3)
    url = await server.start()
    try:
        settings = ProbeSettings(
            base_url=url, probes=(ProbeName.TOOLCALL_ECHO,), concurrency=4, requests=40
        )
        return build_report(await run_probes(settings))
    finally:
        await server.stop()


def test_report_as_html_is_the_probes_own_page(monkeypatch, capsys):
    report = asyncio.run(_probed_report())
    monkeypatch.setattr(rollout_cli, "connect", lambda _: ReportKube(report))
    assert main(["rollout", "report", "flash", "--output", "html"]) == 0
    assert capsys.readouterr().out == render_html(report) + "\n"


def test_report_as_html_without_samples_is_one_line_naming_the_report(monkeypatch, capsys):
    unreachable = {"verdict": "INCONCLUSIVE", "base_url": "http://x", "reasons": ["refused"]}
    monkeypatch.setattr(rollout_cli, "connect", lambda _: ReportKube(unreachable))
    assert main(["rollout", "report", "flash", "--output", "html"]) == 1
    err = capsys.readouterr().err
    assert "report flash-report-1 has no probe samples" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("spec", "budget"), [({}, "0.5000%"), ({"maxCorruptionRate": 0.01}, "1.000%")]
)
def test_status_shows_the_bound_beside_the_budget_in_digits_that_tell_them_apart(
    spec, budget, monkeypatch, capsys
):
    """A PASS at the default minimum has a bound of 0.49967%: "0.500%" beside a 0.5% budget
    would read as no margin at all."""
    rollout = {"phase": "Idle", "verdict": "PASS", "bound": 0.0049967, "samples": 598}
    kube = PatchRecordingKube(rollout)
    kube.get = lambda kind, namespace, name: {  # type: ignore[method-assign]
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"canary": spec},
        "status": {"rollout": rollout},
    }
    monkeypatch.setattr(rollout_cli, "connect", lambda kubeconfig: kube)
    assert main(["rollout", "status", "flash", "-n", "serving"]) == 0
    shown = "0.4997%" if budget == "0.5000%" else "0.500%"
    assert f"upper bound        {shown} (budget {budget})" in capsys.readouterr().out


DECIDED = {
    "phase": "RolledBack",
    "verdict": "FAIL",
    "verdictReason": "garbled tool calls",
    "startedAt": "2026-12-01T10:00:00Z",
    "phaseSince": "2026-12-01T10:01:30Z",
}


def link_of(out: str) -> dict[str, list[str]]:
    """The query of the one `dashboard` line of ``out``, after checking where it points."""
    (line,) = [line for line in out.splitlines() if line.startswith("dashboard")]
    url = urlsplit(line.split()[-1])
    assert (url.scheme, url.netloc, url.path) == ("https", "grafana.example", "/g/d/dsv4-operator")
    return parse_qs(url.query)


def millis(stamp: str) -> int:
    return int(dt.datetime.fromisoformat(stamp).timestamp() * 1000)


@pytest.mark.parametrize("action", ["status", "report"])
def test_with_grafana_configured_the_rollout_links_its_dashboard_around_the_verdict(
    action, monkeypatch, capsys
):
    monkeypatch.setenv("DSV4_GRAFANA_URL", "https://grafana.example/g/")
    monkeypatch.setattr(rollout_cli, "connect", lambda _: PatchRecordingKube(DECIDED))
    assert main(["rollout", action, "flash", "-n", "serving"]) == 0
    query = link_of(capsys.readouterr().out)
    assert query["var-namespace"] == ["serving"] and query["var-deployment"] == ["flash"]
    # Five minutes before the canary started, ten after the verdict.
    assert query["from"] == [str(millis("2026-12-01T09:55:00+00:00"))]
    assert query["to"] == [str(millis("2026-12-01T10:11:30+00:00"))]


def test_a_rollout_still_running_is_linked_up_to_now_and_the_option_wins_over_the_env(
    monkeypatch, capsys
):
    monkeypatch.setenv("DSV4_GRAFANA_URL", "https://elsewhere.example")
    running = {**PROBING, "startedAt": "2026-12-01T10:00:00Z", "phaseSince": "2026-12-01T10:00:40Z"}
    monkeypatch.setattr(rollout_cli, "connect", lambda _: PatchRecordingKube(running))
    args = [
        "rollout",
        "status",
        "flash",
        "-n",
        "serving",
        "--grafana-url",
        "https://grafana.example/g",
    ]
    assert main(args) == 0
    assert link_of(capsys.readouterr().out)["to"] == ["now"]


def test_without_grafana_configured_no_link_is_printed(monkeypatch, capsys):
    monkeypatch.delenv("DSV4_GRAFANA_URL", raising=False)
    monkeypatch.setattr(rollout_cli, "connect", lambda _: PatchRecordingKube(DECIDED))
    assert main(["rollout", "report", "flash"]) == 0
    assert "dashboard" not in capsys.readouterr().out


def test_a_grafana_url_that_is_not_one_is_refused_naming_the_option(monkeypatch, capsys):
    monkeypatch.setattr(rollout_cli, "connect", lambda _: PatchRecordingKube(DECIDED))
    assert main(["rollout", "report", "flash", "--grafana-url", "grafana:3000"]) == 2
    err = capsys.readouterr().err
    assert "--grafana-url (or $DSV4_GRAFANA_URL)" in err and "'grafana:3000'" in err
    assert "Traceback" not in err
