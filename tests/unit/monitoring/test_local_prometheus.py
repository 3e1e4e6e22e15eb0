"""The local Prometheus's configuration is the shipped monitors' and rules' (dsv4_dev.monitoring).

What it scrapes live, and that its alerts fire, is tests/e2e/test_monitoring.py's and the
README tour's; here: that each monitor field reaches the scrape_config, that Prometheus
itself accepts the result (promtool), and where discovery sends a scrape."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from dsv4_dev.cluster.binaries import MissingBinaryError
from dsv4_dev.cluster.monitoring import _unix, alert_lines
from dsv4_dev.localrun import endpoints
from dsv4_dev.monitoring import config, discovery
from dsv4_dev.monitoring.server import prometheus_binary
from dsv4_operator import metrics
from dsv4_operator.api.rollout import RolloutPhase, RolloutVerdict

SD = "http://127.0.0.1:9000"


def by_job(configs: list[dict]) -> dict[str, dict]:
    return {c["job_name"]: c for c in configs}


def keep_regex(scrape: dict, source: str) -> str:
    (rule,) = [
        r
        for r in scrape["relabel_configs"]
        if r.get("action") == "keep" and r["source_labels"][0] == source
    ]
    return rule["regex"]


def test_each_monitor_endpoint_is_a_scrape_config_with_its_port_path_labels_and_interval():
    (service_monitor,) = config.shipped("ServiceMonitor")
    monitors = {m["metadata"]["name"]: m for m in config.shipped("PodMonitor")}
    (operator_job,) = config.scrape_configs(service_monitor, SD)
    (engines_job,) = config.scrape_configs(monitors["dsv4-engines"], SD)
    (routers_job,) = config.scrape_configs(monitors["dsv4-routers"], SD)
    (endpoint,) = service_monitor["spec"]["endpoints"]
    assert operator_job["job_name"] == "serviceMonitor/dsv4-system/dsv4-operator/0"
    assert operator_job["scrape_interval"] == endpoint["interval"] == "30s"
    assert operator_job["metrics_path"] == endpoint["path"]
    assert operator_job["honor_labels"] is True
    assert (
        operator_job["http_sd_configs"][0]["url"]
        == f"{SD}/targets/endpointslice?namespace=dsv4-system"
    )
    assert keep_regex(operator_job, "__meta_kubernetes_endpointslice_port_name") == "metrics"
    name = "__meta_kubernetes_service_label_app_kubernetes_io_name"
    assert keep_regex(operator_job, name) == r"(dsv4\-operator);true"
    # A PodMonitor with `namespaceSelector: {any: true}` watches every namespace.
    assert engines_job["http_sd_configs"][0]["url"] == f"{SD}/targets/pod"
    assert keep_regex(engines_job, "__meta_kubernetes_pod_container_port_name") == "http"
    component = "__meta_kubernetes_pod_label_app_kubernetes_io_component"
    assert keep_regex(engines_job, component) == "(prefill|decode);true"
    job = [r for r in engines_job["relabel_configs"] if r.get("target_label") == "job"]
    assert job == [{"target_label": "job", "replacement": "dsv4-system/dsv4-engines"}]
    # podTargetLabels: the engine's deployment and role on each of its series.
    copied = {
        r["target_label"]: r["source_labels"]
        for r in engines_job["relabel_configs"]
        if r.get("regex") == "(.+)"
    }
    assert copied == {
        "app_kubernetes_io_instance": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"],
        "app_kubernetes_io_component": ["__meta_kubernetes_pod_label_app_kubernetes_io_component"],
    }
    # The routers: sglang-router's own page, on the port the operator names `metrics`.
    assert keep_regex(routers_job, "__meta_kubernetes_pod_container_port_name") == "metrics"
    assert keep_regex(routers_job, component) == "(router);true"


def test_a_changed_monitor_changes_the_scrape_config():
    (monitor,) = config.shipped("ServiceMonitor")
    monitor["spec"]["endpoints"][0]["port"] = "http"
    monitor["spec"]["selector"]["matchLabels"] = {"team": "inference"}
    (scrape,) = config.scrape_configs(monitor, SD)
    assert keep_regex(scrape, "__meta_kubernetes_endpointslice_port_name") == "http"
    assert keep_regex(scrape, "__meta_kubernetes_service_label_team") == "(inference);true"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing: make system-deps")
def test_prometheus_accepts_the_local_configuration_and_its_rules(tmp_path: Path):
    path = config.write(tmp_path, SD)
    local = config.prometheus_config(SD, tmp_path / "rules.yaml")
    assert {c["scrape_interval"] for c in local["scrape_configs"]} == {config.LOCAL_INTERVAL}
    assert local["global"]["evaluation_interval"] == config.LOCAL_INTERVAL
    result = subprocess.run(
        ["promtool", "check", "config", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 17 rules found" in result.stdout


def test_rule_metrics_lists_the_series_of_expressions_and_annotation_queries():
    used = config.rule_metrics()
    assert used["DSV4OperatorDown"] == {"up"}
    assert used["DSV4PostPromotionCorruption"] == {
        "dsv4_operator_stable_corruption_detected",
        "dsv4_operator_canary_corruption_upper_bound",  # its description's query
    }
    # A recorded series stands for the metrics its recording rule reads.
    assert used["DSV4LiveToolCallCorruption"] == {
        "dsv4_engine_tool_call_answers_total",
        "dsv4_operator_canary_max_corruption_rate",  # the budget a fresh revision is held to
    }
    assert config.metric_names(
        'max by (a, b) (x{c="d"}) and on (a) (time() - y[5m] offset 1m > 3600)'
    ) == {"x", "y"}
    assert config.metric_names("0 * x + on (a) group_left max by (a) (y)") == {"x", "y"}


def test_every_verdict_counter_is_exported_at_zero_from_a_deployments_first_pass():
    metrics.record_phase("ns-zero", "fresh", RolloutPhase.IDLE, 0.0, 0.005)
    text = generate_latest(metrics.REGISTRY).decode()
    for verdict in RolloutVerdict:
        line = f'dsv4_operator_canary_verdicts_total{{name="fresh",namespace="ns-zero",verdict="{verdict.value}"}} 0.0'
        assert line in text
    assert 'dsv4_operator_rollbacks_total{name="fresh",namespace="ns-zero"} 0.0' in text


def pod(name: str, ip: str, labels: dict, ports: list[dict]) -> dict:
    return {
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {"containers": [{"name": "c", "ports": ports}]},
        "status": {"podIP": ip, "phase": "Running"},
    }


ENGINE = pod(
    "flash-decode-0",
    "10.0.0.3",
    {"app.kubernetes.io/name": "dsv4", "app.kubernetes.io/component": "decode"},
    [{"name": "http", "containerPort": 30000}, {"name": "dist", "containerPort": 5000}],
)
OPERATOR = pod(
    "dsv4-operator-abc", "10.0.0.1", {"app": "op"}, [{"name": "http", "containerPort": 8080}]
)
SERVICE = {
    "metadata": {"name": "op-metrics", "namespace": "default", "labels": {"team": "x"}},
    "spec": {
        "selector": {"app": "op"},
        "ports": [{"name": "metrics", "port": 8080, "targetPort": "http"}],
    },
}
PUBLISHED = {
    endpoints.pod_key("flash-decode-0", "default"): "http://127.0.0.1:41003",
    endpoints.key("op-metrics", "default", 8080): "http://127.0.0.1:8081",
}


def test_a_scrape_reaches_the_local_process_that_plays_the_pod():
    objects = {"Pod": [ENGINE, OPERATOR], "Service": [SERVICE], "EndpointSlice": []}
    targets = {
        (
            t["labels"]["__meta_kubernetes_pod_name"],
            t["labels"]["__meta_kubernetes_pod_container_port_name"],
        ): t["targets"][0]
        for t in discovery.pod_targets(objects, PUBLISHED)
    }
    assert targets == {
        ("flash-decode-0", "http"): "127.0.0.1:41003",  # its engine
        ("flash-decode-0", "dist"): "10.0.0.3:5000",  # nothing local: the pod's own address
        ("dsv4-operator-abc", "http"): "127.0.0.1:8081",  # its Service's stand-in
    }


def test_an_endpointslice_target_carries_its_services_and_pods_labels():
    piece = {
        "metadata": {
            "name": "op-metrics-x",
            "namespace": "default",
            "labels": {discovery.SERVICE_NAME_LABEL: "op-metrics"},
        },
        "endpoints": [
            {
                "addresses": ["10.0.0.1"],
                "conditions": {"ready": True},
                "targetRef": {"kind": "Pod", "name": "dsv4-operator-abc"},
            }
        ],
        "ports": [{"name": "metrics", "port": 8080}],
    }
    objects = {"Pod": [OPERATOR], "Service": [SERVICE], "EndpointSlice": [piece]}
    (target,) = discovery.endpointslice_targets(objects, PUBLISHED)
    assert target["targets"] == ["127.0.0.1:8081"]
    labels = target["labels"]
    assert labels["__meta_kubernetes_service_name"] == "op-metrics"
    assert labels["__meta_kubernetes_service_label_team"] == "x"
    assert labels["__meta_kubernetes_endpointslice_port_name"] == "metrics"
    assert labels["__meta_kubernetes_pod_name"] == "dsv4-operator-abc"
    assert labels["__meta_kubernetes_pod_container_name"] == "c"


def test_alerts_are_one_line_each_and_prometheus_times_parse():
    alerts = [
        {
            "labels": {"alertname": "DSV4CanaryFailed", "name": "flash", "namespace": "default"},
            "state": "firing",
        }
    ]
    assert alert_lines([]) == ["no alert pending or firing"]
    assert alert_lines(alerts)[0].split() == [
        "DSV4CanaryFailed",
        "firing",
        "name=flash",
        "namespace=default",
    ]
    assert _unix("1970-01-01T00:00:01.5Z") == 1.5
    assert _unix("1970-01-01T01:00:02.123456789+01:00") == pytest.approx(2.123456789)


def test_without_the_prometheus_server_monitoring_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH with no prometheus on it
    with pytest.raises(
        MissingBinaryError, match=r"Debian's `prometheus` package.*make system-deps"
    ):
        prometheus_binary()
