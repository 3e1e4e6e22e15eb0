"""The shipped Grafana dashboard is one a Grafana can load and a Prometheus can answer.

Here: its shape (a Prometheus target on every panel, the template variables), that every
query is PromQL Prometheus parses (promtool), that it names only series the operator or the
reference engine exports (or, for the one SGLang series the reference engine lacks, says
so), that the ConfigMap the monitoring overlay generates carries exactly the JSON file, and
the budget gauge its corruption panel draws.  That every query returns data from a live
Prometheus during a rollout is tests/e2e/test_monitoring.py's.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dsv4_dev.cluster import binaries
from dsv4_dev.monitoring import dashboard
from dsv4_dev.monitoring.config import MONITORING, metric_names
from dsv4_engine import live_judge
from dsv4_engine.live_judge import LiveJudge
from dsv4_engine.probe.dsml_format import DsmlFormat
from dsv4_engine.reference.metrics import EngineStats, Page, ServedCounts, render
from dsv4_operator import metrics
from dsv4_operator.cli import dashboard as cli_dashboard
from tests.unit.operator.harness import NS, World

VARIABLES = {"namespace": "serving", "deployment": "flash"}
# SGLang series a panel shows that the reference engine does not serve (the e2e test's
# allow-list holds the same queries, with the reason).
SGLANG_ONLY = {"sglang:kv_transfer_latency_ms_bucket"}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


@pytest.fixture(scope="module")
def shipped() -> dict:
    return dashboard.load()


def operator_series() -> set[str]:
    """Every series name the operator's registry exposes, as Prometheus stores them."""
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}
    return {
        family.name + suffix
        for family in metrics.REGISTRY.collect()
        for suffix in suffixes.get(family.type, [""])
    }


def engine_series() -> set[str]:
    """Every series name the reference engine's /metrics serves (its live judge's too)."""
    judge = LiveJudge(DsmlFormat.V4)
    try:
        live = live_judge.render(judge)
    finally:
        judge.stop()
    page = Page(EngineStats(), ServedCounts(), "m", "unified", 128, 1, 2, 0, 0, False, 0, {}, live)
    text = render(page)
    return {line.split("{")[0] for line in text.splitlines() if not line.startswith("#")}


def test_every_panel_queries_prometheus_through_the_datasource_variable(shipped):
    panels = dashboard.panels(shipped)
    assert len(panels) >= 14
    for panel in panels:
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(set(refs)) == len(refs), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE and target["expr"], panel["title"]
        assert panel["description"], panel["title"]
    ids = [p["id"] for p in shipped["panels"]]
    assert len(set(ids)) == len(ids)


def test_the_link_dsv4ctl_prints_opens_this_dashboard_on_one_deployment(shipped):
    """`dsv4ctl rollout report|status` link to it by uid, with its two variables set."""
    assert shipped["uid"] == cli_dashboard.DASHBOARD_UID
    names = {v["name"] for v in shipped["templating"]["list"]}
    assert {cli_dashboard.NAMESPACE_VARIABLE, cli_dashboard.DEPLOYMENT_VARIABLE} <= names


def test_the_variables_pick_a_namespace_then_one_of_its_deployments(shipped):
    variables = {v["name"]: v for v in shipped["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["namespace"]["query"]["query"] == (
        "label_values(dsv4_operator_rollout_phase, namespace)"
    )
    assert variables["deployment"]["query"]["query"] == (
        'label_values(dsv4_operator_rollout_phase{namespace="$namespace"}, name)'
    )
    # Every per-deployment query is narrowed to the chosen one (the live-integrity row to
    # it and its canary); the operator-wide reconcile series have no deployment label.
    chosen = ('"$deployment"', '=~"$deployment|$deployment--canary"')
    for query in dashboard.queries(shipped):
        if "dsv4_operator_reconcile" not in query.expr:
            assert any(c in query.expr for c in chosen) and '"$namespace"' in query.expr, query


def test_the_dashboard_names_only_series_that_are_exported(shipped):
    exported = operator_series() | engine_series()
    used = {
        name
        for query in dashboard.queries(shipped)
        for name in metric_names(dashboard.expand(query.expr, VARIABLES))
    }
    assert used - exported == SGLANG_ONLY
    # The docs' SGLang series and the reference engine's stale-read counter are all shown.
    assert {
        "sglang:num_running_reqs",
        "sglang:token_usage",
        "sglang:cache_hit_rate",
        "sglang:load_back_tokens_total",
        "dsv4:index_k_reads_during_load_total",
        "dsv4_operator_canary_max_corruption_rate",
    } <= used


def test_an_unknown_variable_is_an_error_not_a_query():
    assert dashboard.expand('x[$__rate_interval]{a="${namespace}"}', VARIABLES) == (
        'x[1m]{a="serving"}'
    )
    with pytest.raises(KeyError, match="cluster"):
        dashboard.expand('x{a="$cluster"}', VARIABLES)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing: make system-deps")
def test_prometheus_parses_every_query(shipped, tmp_path: Path):
    """promtool has no query parser of its own: each query becomes a recording rule."""
    queries = dashboard.queries(shipped)
    rules = [
        {"record": f"dashboard:query:{n}", "expr": dashboard.expand(q.expr, VARIABLES)}
        for n, q in enumerate(queries)
    ]
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(queries)} rules found" in result.stdout


def test_the_monitoring_overlay_ships_the_json_file_as_a_sidecar_configmap():
    out = subprocess.run(
        [str(binaries.kubectl()), "kustomize", str(MONITORING)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (configmap,) = [
        doc
        for doc in yaml.safe_load_all(out)
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == "dsv4-dashboard"
    ]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["namespace"] == "dsv4-system"
    assert configmap["data"] == {"dsv4.json": dashboard.DASHBOARD.read_text()}


def budget_gauge() -> float | None:
    return metrics.REGISTRY.get_sample_value(
        "dsv4_operator_canary_max_corruption_rate", {"namespace": NS, "name": "budgeted"}
    )


def test_the_budget_gauge_follows_spec_canary_max_corruption_rate():
    world = World()
    world.create("budgeted", {"canary": {"maxCorruptionRate": 0.01}})
    world.step("budgeted")
    assert budget_gauge() == 0.01
    world.patch_spec("budgeted", {"canary": {"maxCorruptionRate": 0.02}})
    world.step("budgeted")
    assert budget_gauge() == 0.02


def test_a_panel_is_drawn_with_grafanas_legends_and_gaps_where_prometheus_has_nan():
    target = {"refId": "A", "legendFormat": "rate ({{target}})"}
    assert dashboard.legend(target, {"target": "canary"}) == "rate (canary)"
    assert dashboard.legend({"refId": "B", "legendFormat": "{{pod}}"}, {}) == "B"
    nan = float("nan")
    bound = [(0, 0.1), (2, 0.15), (4, nan), (6, 0.2)]
    svg = dashboard.chart("Bound <vs> budget", "percentunit", [("bound", bound)], (0, 10))
    # The NaN splits the series: a line, then a lone sample as a dot.
    assert svg.count("<polyline") == 1 and svg.count("<circle") == 1
    assert "20.00%" in svg and "Bound &lt;vs&gt; budget" in svg
    assert 'class="data"' not in dashboard.chart("empty", None, [], (0, 10))
