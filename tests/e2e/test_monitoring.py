"""The shipped monitors and alert rules in a real Prometheus, on a real control plane.

The local Prometheus (`dsv4ctl cluster up --monitoring`, `dsv4_dev.monitoring`) scrapes what
the shipped ServiceMonitor and PodMonitor select, with the shipped PrometheusRule: the
operator (a local process standing in for the pod `manifests/base` installs, reached through
the metrics Service base installs) and each engine pod the local runtime runs.  One
deployment lives through the module: the flags of the incident's race (HiCache, a bf16
index-K, `faultInjection.ungatedIndexK`) are promoted by hand without their verdict, the
production watch finds them corrupt, and `DSV4PostPromotionCorruption` fires; then every
series the rules use is in the scrape, and every query of the shipped Grafana dashboard
(manifests/monitoring/dashboards/dsv4.json) returns data for that deployment.  (A FAIL firing `DSV4CanaryFailed`, and a PASS
firing nothing, are shown by the README tour, tests/e2e/test_readme_tour.py.)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from dsv4_dev.cluster.local import LocalCluster
from dsv4_dev.cluster.monitoring import Monitoring, _unix
from dsv4_dev.monitoring import config, dashboard
from dsv4_operator.api.crd import CRD_PATH
from dsv4_operator.api.samples import shipped_sample
from dsv4_operator.render.meta import ANNOTATION_CONFIG_HASH
from tests.e2e.helpers import (
    MANIFESTS,
    OPERATOR_NS,
    ToolCallUsers,
    as_list,
    get_json,
    kustomize,
    operator_and_runtime,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NS = "monitoring-e2e"
NAME = "flash"
RACE = {
    "hicache": {"enabled": True, "ratio": 2.0},
    "indexDtype": "bf16",
    "faultInjection": {"ungatedIndexK": True},
    "kvCanary": "log",  # production counts its violations (DSV4ProductionKvCanaryViolation)
}
# What the race in production fires from the users' traffic alone.
LIVE_ALERTS = {"DSV4LiveToolCallCorruption", "DSV4ProductionKvCanaryViolation"}
# What of base the operator's scrape needs: its pod (KWOK runs nothing in it) and the
# metrics Service in front of it.
OPERATOR_POD_KINDS = {"Namespace", "ServiceAccount", "Deployment", "Service"}
VERDICT_TIMEOUT = 600
# The bound the live-integrity alerts fire within, from the users' first request: their
# rules' windows fill from the first scrape, and the corrupt-rate alert holds for 1 minute
# before firing.  1.5-2 minutes on an idle machine; the bound leaves room for a loaded one
# (the reference engines answer the users slower there).
LIVE_ALERT_MINUTES = 8
CHART_STEP = 2  # seconds between a chart's points: the local scrape interval
DATA = 'class="data"'  # what a chart draws for each stretch of a series
# Dashboard queries (panel title, refId) the local cluster cannot answer, and why.
NOT_SERVED_LOCALLY = {
    ("PD KV transfer latency", "A"): (
        "sglang:kv_transfer_latency_ms is SGLang's histogram of its PD KV transfers; the "
        "reference engine does not time its transfers and serves no such series"
    ),
}


@pytest.fixture(scope="module")
def world(cluster: LocalCluster, tmp_path_factory):
    logs = tmp_path_factory.mktemp("monitoring")
    monitoring = Monitoring(cluster)
    base = [o for o in kustomize(cluster, MANIFESTS / "base") if o["kind"] in OPERATOR_POD_KINDS]
    cluster.kubectl("apply", "--server-side", "-f", str(CRD_PATH))
    cluster.wait_established("crd/dsv4deployments.inference.dsv4.dev")
    # On the way out it deletes what it applied, and dsv4-system only if it made it: the
    # namespace may hold the settings of a fence another test installed, and a bound fence
    # without them denies every later write in a served namespace.
    had_namespace = cluster.kubectl("get", "namespace", OPERATOR_NS, check=False).returncode == 0
    cluster.kubectl("apply", "--server-side", "-f", "-", input=as_list(base))
    cluster.kubectl("create", "namespace", NS, check=False)
    operator, runtime = operator_and_runtime(cluster, NS, logs)
    monitoring.start()
    operator.start()
    runtime.start()
    try:
        cluster.kubectl(
            "apply", "-n", NS, "-f", "-", input=json.dumps(shipped_sample("flash-reference"))
        )
        wait_for("deployment Ready", lambda: status(cluster).get("phase") == "Ready", 180)
        yield cluster, monitoring
    finally:
        cluster.kubectl("delete", "dsv4", NAME, "-n", NS, "--wait=false", check=False)
        operator.stop()
        runtime.stop()
        monitoring.stop()
        added = [o for o in base if o["kind"] != "Namespace" or not had_namespace]
        cluster.kubectl("delete", "--wait=false", "-f", "-", input=as_list(added), check=False)


def status(cluster: LocalCluster) -> dict:
    return get_json(cluster, "dsv4", NAME, "-n", NS).get("status") or {}


def promote(cluster: LocalCluster) -> bool:
    command = [str(Path(sys.executable).with_name("dsv4ctl")), "rollout", "promote", NAME]
    result = subprocess.run(
        [*command, "-n", NS], capture_output=True, text=True, env=cluster.env, timeout=60
    )
    return result.returncode == 0


def query(monitoring: Monitoring, promql: str) -> list[dict]:
    return monitoring.api(f"/api/v1/query?query={quote(promql)}")["result"]


def scraped(monitoring: Monitoring) -> dict[tuple[str, str, str], str]:
    """(job, namespace, pod) → health of every active target."""
    targets = monitoring.api("/api/v1/targets?state=active")["activeTargets"]
    return {
        (t["labels"]["job"], t["labels"]["namespace"], t["labels"]["pod"]): t["health"]
        for t in targets
    }


def firing_alerts(monitoring: Monitoring) -> dict[str, dict]:
    """The alerts firing now, by name (pending ones left out)."""
    alerts = monitoring.alerts()
    return {a["labels"]["alertname"]: a for a in alerts if a["state"] == "firing"}


def monitor_job(monitor: dict) -> str:
    """A PodMonitor's `job` label, as the Prometheus Operator sets it."""
    return f"{monitor['metadata']['namespace']}/{monitor['metadata']['name']}"


def router_pod(cluster: LocalCluster) -> str:
    (pod,) = get_json(
        cluster,
        "pods",
        "-n",
        NS,
        "-l",
        f"app.kubernetes.io/instance={NAME},app.kubernetes.io/component=router",
    )["items"]
    return pod["metadata"]["name"]


def test_prometheus_scrapes_the_operator_engines_and_router_as_the_shipped_monitors_select(world):
    cluster, monitoring = world
    jobs = {m["metadata"]["name"]: monitor_job(m) for m in config.shipped("PodMonitor")}
    operator_job = "dsv4-operator-metrics"  # its Service's name, as the Prometheus Operator sets it
    engines_job, routers_job = jobs["dsv4-engines"], jobs["dsv4-routers"]
    (operator_pod,) = get_json(
        cluster, "pods", "-n", OPERATOR_NS, "-l", "app.kubernetes.io/name=dsv4-operator"
    )["items"]
    wanted = {
        (operator_job, OPERATOR_NS, operator_pod["metadata"]["name"]): "up",
        (engines_job, NS, f"{NAME}-prefill-0"): "up",
        (engines_job, NS, f"{NAME}-decode-0"): "up",
        (routers_job, NS, router_pod(cluster)): "up",
    }
    found = wait_for(
        "the operator, both engines and the router scraped",
        lambda: (seen := scraped(monitoring)).items() >= wanted.items() and seen,
        60,
    )
    # Nothing else of this deployment: its router pod is no engine, its engines no router.
    assert {k for k in found if k[1] == NS} == {k for k in wanted if k[1] == NS}
    # sglang-router's own page: its requests counter, labelled with the deployment.
    router_series = query(monitoring, f'{{job="{routers_job}", namespace="{NS}"}}')
    assert {s["metric"].get("app_kubernetes_io_instance") for s in router_series} == {NAME}
    engine_series = query(monitoring, f'sglang:num_running_reqs{{namespace="{NS}"}}')
    assert {s["metric"]["pod"] for s in engine_series} == {f"{NAME}-prefill-0", f"{NAME}-decode-0"}


def test_corruption_users_get_in_production_fires_the_live_alert_without_a_watch_run(world):
    """The race's flags promoted by hand (the one way corrupting flags reach production),
    the production watch off: 64 sessions of agent-like users send tool-call requests
    through the router Service, the engines judge each answer they serve, and
    `DSV4LiveToolCallCorruption` fires on what the users got — no probe involved."""
    cluster, monitoring = world
    assert not monitoring.alerts(), "a healthy deployment raised an alert"
    # The race is on the host-tier path: production's prefill pool, as small as a busy
    # one's free share, makes requests evict prefixes and read them back.
    spec = {
        "features": RACE,
        "prefill": {"maxTotalTokens": 4096},
        "rollout": {"stableProbeIntervalSeconds": 0},
    }
    cluster.kubectl(
        "patch", "dsv4", NAME, "-n", NS, "--type=merge", "-p", json.dumps({"spec": spec})
    )
    wait_for("the canary's promote accepted", lambda: promote(cluster), 120, interval=1)
    wait_for(
        "the race's flags serving production",
        lambda: (
            status(cluster).get("phase") == "Ready"
            and (status(cluster).get("rollout") or {}).get("verdict") == "MANUAL_PROMOTE"
        ),
        VERDICT_TIMEOUT,
    )
    watched = (status(cluster).get("rollout") or {}).get("stableProbe")
    users = ToolCallUsers(cluster, NS, f"{NAME}-router", sessions=64)
    started = time.monotonic()
    users.start()
    try:
        seen: dict[str, dict] = {}

        def fired() -> dict[str, dict] | None:
            seen.clear()
            seen.update(firing_alerts(monitoring))
            return dict(seen) if LIVE_ALERTS <= set(seen) else None

        try:
            firing = wait_for("the live-integrity alerts firing", fired, LIVE_ALERT_MINUTES * 60, 5)
        except AssertionError as err:
            judged = query(
                monitoring,
                f'sum by (outcome) (dsv4_engine_tool_call_answers_total{{namespace="{NS}"}})',
            )
            counts = {s["metric"].get("outcome"): s["value"][1] for s in judged}
            raise AssertionError(
                f"{err}; firing: {sorted(seen)}; answers judged: {counts}; users: {users.ok} "
                f"answered, {len(users.failed)} failed"
            ) from None
    finally:
        users.stop()
    minutes = (time.monotonic() - started) / 60
    print(f"{sorted(LIVE_ALERTS)} fired {minutes:.1f} min into the users' load")
    assert set(firing) == LIVE_ALERTS, firing
    alert = firing["DSV4LiveToolCallCorruption"]
    decode = get_json(
        cluster,
        "pods",
        "-n",
        NS,
        "-l",
        f"app.kubernetes.io/instance={NAME},app.kubernetes.io/component=decode",
    )["items"]
    served = {p["metadata"]["annotations"][ANNOTATION_CONFIG_HASH] for p in decode}
    assert {alert["labels"]["revision"]} == served, "the alert names the revision users got"
    assert alert["labels"]["app_kubernetes_io_instance"] == NAME
    assert status(cluster)["rollout"].get("stableProbe") == watched, "no watch run took part"
    assert users.ok > 0


def test_a_promoted_revision_the_production_watch_finds_corrupt_fires_the_critical_alert(world):
    cluster, monitoring = world
    patch = {"spec": {"rollout": {"stableProbeIntervalSeconds": 5}}}
    cluster.kubectl("patch", "dsv4", NAME, "-n", NS, "--type=merge", "-p", json.dumps(patch))
    wait_for(
        "a production watch run that finds corruption",
        lambda: (
            (status(cluster).get("rollout") or {}).get("stableProbe", {}).get("verdict")
            == "Corrupt"
        ),
        VERDICT_TIMEOUT,
    )
    alerts = firing_alerts(monitoring)
    # Beside it, at most what the users' answers fired (still in its window).
    assert (
        {"DSV4PostPromotionCorruption"}
        <= set(alerts)
        <= {"DSV4PostPromotionCorruption", *LIVE_ALERTS}
    )
    alert = alerts["DSV4PostPromotionCorruption"]
    assert alert["labels"]["namespace"] == NS and alert["labels"]["name"] == NAME
    assert alert["labels"]["severity"] == "critical"
    # The annotation's own query found the watch's bound (as a percentage).
    assert "corruption bound" in alert["annotations"]["description"]
    assert "%)" in alert["annotations"]["description"], alert["annotations"]


def test_every_series_an_alert_rule_uses_is_scraped(world):
    _, monitoring = world
    missing = {
        alert: sorted(name for name in names if not query(monitoring, f"count({name})"))
        for alert, names in config.rule_metrics().items()
    }
    assert not any(missing.values()), f"series no scrape has: {missing}"


def test_every_dashboard_query_returns_data_for_the_deployment(world):
    """After the module's rollout (a canary, a promotion, the production watch's runs)."""
    _, monitoring = world
    # The template variables offer this deployment (their label_values read this series).
    offered = query(monitoring, "dsv4_operator_rollout_phase")
    assert (NS, NAME) in {(s["metric"]["namespace"], s["metric"]["name"]) for s in offered}
    variables = {"namespace": NS, "deployment": NAME}
    expanded = {
        (q.panel, q.ref): dashboard.expand(q.expr, variables)
        for q in dashboard.queries(dashboard.load())
    }
    assert NOT_SERVED_LOCALLY.keys() <= expanded.keys()
    served = {key: expr for key, expr in expanded.items() if key not in NOT_SERVED_LOCALLY}
    empty: list[tuple[str, str]] = []

    def all_answered() -> bool:
        empty[:] = [key for key, expr in served.items() if not query(monitoring, expr)]
        return not empty

    try:
        wait_for("every dashboard query to return data", all_answered, 60)
    except AssertionError as err:
        raise AssertionError(f"{err}; no data: {[(k, served[k]) for k in empty]}") from None
    for key, why in NOT_SERVED_LOCALLY.items():
        assert not query(monitoring, expanded[key]), f"{key} has data now ({why}): drop it"


def charts(monitoring: Monitoring, start: float) -> dict[str, tuple[str, str]]:
    """Every panel's title → (file name, SVG chart of its queries), from ``start`` to now
    in steps of the scrape interval, the last one now."""
    end = float(monitoring.api("/api/v1/query?query=time()")["result"][0])
    first = end - CHART_STEP * ((end - start) // CHART_STEP)
    variables = {"namespace": NS, "deployment": NAME}
    drawn = {}
    for panel in dashboard.panels(dashboard.load()):
        series = []
        for target in panel["targets"]:
            promql = quote(dashboard.expand(target["expr"], variables))
            window = f"start={first}&end={end}&step={CHART_STEP}"
            found = monitoring.api(f"/api/v1/query_range?query={promql}&{window}")["result"]
            series += [
                (
                    dashboard.legend(target, s["metric"]),
                    [(float(t), float(v)) for t, v in s["values"]],
                )
                for s in found
            ]
        unit = panel["fieldConfig"]["defaults"].get("unit")
        slug = re.sub(r"[^a-z0-9]+", "-", panel["title"].lower()).strip("-")
        drawn[panel["title"]] = (
            f"{panel['id']:02d}-{slug}.svg",
            dashboard.chart(panel["title"], unit, series, (start, end)),
        )
    return drawn


def test_each_dashboard_panel_draws_the_rollout(world, tmp_path):
    """Every panel as a small SVG chart of its queries over the module's rollout, into
    $DSV4_DASHBOARD_SVG when set (how the docs' pictures are made), else a temporary folder."""
    _, monitoring = world
    # The module's rollout: from Prometheus's start (the module's) to now.
    start = _unix(monitoring.api("/api/v1/status/runtimeinfo")["startTime"])
    skipped = {panel for panel, _ in NOT_SERVED_LOCALLY}
    blank: list[str] = []

    def all_drawn() -> dict[str, tuple[str, str]] | None:
        drawn = charts(monitoring, start)
        blank[:] = [t for t, (_, svg) in drawn.items() if t not in skipped and DATA not in svg]
        return None if blank else drawn

    try:
        drawn = wait_for("every panel drawn with data", all_drawn, 60)
    except AssertionError as err:
        raise AssertionError(f"{err}; drawn without data: {blank}") from None
    folder = Path(os.environ.get("DSV4_DASHBOARD_SVG") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    for title, (name, svg) in drawn.items():
        (folder / name).write_text(svg)
        assert (DATA in svg) is (title not in skipped), title
