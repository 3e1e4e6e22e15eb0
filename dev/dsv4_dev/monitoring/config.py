"""The local Prometheus's configuration, generated from what ships in manifests/monitoring.

Each endpoint of each shipped ServiceMonitor and PodMonitor becomes one scrape_config, as the
Prometheus Operator generates it: Kubernetes service discovery (role `endpointslice` for a
ServiceMonitor, `pod` for a PodMonitor, in the namespaces its namespaceSelector names),
relabelling that keeps only the targets whose Service or pod labels match the monitor's
selector and whose port has the monitor's port name, the monitor's path and honorLabels,
and the target labels the alert rules are written against (`job` is the Service's name for
a ServiceMonitor, `<namespace>/<name>` of a PodMonitor; `namespace`, `pod`, `service`,
`container`, `endpoint`, and the pod labels `podTargetLabels` names).  A monitor that
changes (a label, a port name, a path) changes what this Prometheus scrapes, so the live
tests fail when the shipped objects drift from what the operator renders and serves.

The discovery itself is served by `discovery` over HTTP SD (Debian's Prometheus has no
`kubernetes_sd_configs`): the same objects, read from the cluster's API server, with the
same meta labels, and the address of the local process that plays a pod.

The alert rules are the PrometheusRule's `spec` (a Prometheus rules file as it stands).
The monitors' scrape interval (30 s) and Prometheus's default evaluation interval (1 m) are
replaced by ``LOCAL_INTERVAL`` (2 s) here, so a test sees a metric's change in a rule's
state within seconds; the rules themselves are unchanged.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import yaml

ROOT = Path(__file__).resolve().parents[3]
MONITORING = ROOT / "manifests" / "monitoring"
LOCAL_INTERVAL = "2s"

# Per monitor kind: its list of endpoints, the discovery role, the meta label prefix of the
# labels its selector reads, and the meta label of a target's port name.
_KINDS = {
    "ServiceMonitor": (
        "endpoints",
        "endpointslice",
        "__meta_kubernetes_service",
        "__meta_kubernetes_endpointslice_port_name",
    ),
    "PodMonitor": (
        "podMetricsEndpoints",
        "pod",
        "__meta_kubernetes_pod",
        "__meta_kubernetes_pod_container_port_name",
    ),
}
ROLES = tuple(role for _, role, _, _ in _KINDS.values())


def shipped(kind: str) -> list[dict[str, Any]]:
    """Every object of ``kind`` in manifests/monitoring."""
    docs = [
        doc
        for path in sorted(MONITORING.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]
    return [doc for doc in docs if doc.get("kind") == kind]


def rules() -> dict[str, Any]:
    """The PrometheusRule's spec: a Prometheus rules file."""
    (rule,) = shipped("PrometheusRule")
    return rule["spec"]


def meta_label(name: str) -> str:
    """A Kubernetes label name as Prometheus's discovery spells it in a meta label."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _selection(selector: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    """Relabel rules keeping exactly the targets ``selector`` (matchLabels and
    matchExpressions) selects, as the Prometheus Operator writes them."""

    def present(key: str) -> list[str]:
        """The label's value and whether the object has it at all."""
        return [f"{prefix}_label_{meta_label(key)}", f"{prefix}_labelpresent_{meta_label(key)}"]

    kept = [
        {"action": "keep", "source_labels": present(key), "regex": f"({re.escape(value)});true"}
        for key, value in (selector.get("matchLabels") or {}).items()
    ]
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression["key"], expression["operator"]
        values = "|".join(re.escape(v) for v in expression.get("values") or [])
        action, regex = {
            "In": ("keep", f"({values});true"),
            "NotIn": ("drop", f"({values});true"),
            "Exists": ("keep", ".*;true"),
            "DoesNotExist": ("drop", ".*;true"),
        }[operator]
        kept.append({"action": action, "source_labels": present(key), "regex": regex})
    return kept


def _namespaces(monitor: dict[str, Any]) -> list[str] | None:
    """The namespaces a monitor watches: any, the ones it names, or its own."""
    chosen = monitor["spec"].get("namespaceSelector") or {}
    if chosen.get("any"):
        return None
    return chosen.get("matchNames") or [monitor["metadata"]["namespace"]]


def scrape_configs(
    monitor: dict[str, Any], discovery_url: str, interval: str | None = None
) -> list[dict[str, Any]]:
    """One scrape_config per endpoint of ``monitor``, its targets from the HTTP SD at
    ``discovery_url``; ``interval`` replaces the monitor's."""
    endpoints_key, role, prefix, port_label = _KINDS[monitor["kind"]]
    spec, meta = monitor["spec"], monitor["metadata"]
    query = urlencode([("namespace", n) for n in _namespaces(monitor) or []])
    discovery = {
        "url": f"{discovery_url}/targets/{role}" + (f"?{query}" if query else ""),
        "refresh_interval": interval or LOCAL_INTERVAL,
    }
    if monitor["kind"] == "ServiceMonitor":
        service = ["__meta_kubernetes_service_name"]
        job = [
            {"source_labels": service, "target_label": "service"},
            {"source_labels": service, "target_label": "job"},
        ]
    else:
        job = [{"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"}]
    configs = []
    for index, endpoint in enumerate(spec[endpoints_key]):
        relabel = [
            {
                "action": "drop",
                "source_labels": ["__meta_kubernetes_pod_phase"],
                "regex": "(Failed|Succeeded)",
            },
            *_selection(spec["selector"], prefix),
            {"action": "keep", "source_labels": [port_label], "regex": re.escape(endpoint["port"])},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {
                "source_labels": ["__meta_kubernetes_pod_container_name"],
                "target_label": "container",
            },
            *job,
            {"target_label": "endpoint", "replacement": endpoint["port"]},
            *_target_labels(spec),
        ]
        configs.append(
            {
                "job_name": f"{_job_kind(monitor)}/{meta['namespace']}/{meta['name']}/{index}",
                "scrape_interval": interval or endpoint.get("interval", "30s"),
                "metrics_path": endpoint.get("path", "/metrics"),
                "honor_labels": endpoint.get("honorLabels", False),
                "http_sd_configs": [discovery],
                "relabel_configs": relabel,
            }
        )
    return configs


def _target_labels(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """A monitor's `podTargetLabels`: each pod label copied onto the target, under its name
    as a Prometheus label (`app.kubernetes.io/instance` → `app_kubernetes_io_instance`)."""
    return [
        {
            "source_labels": [f"__meta_kubernetes_pod_label_{meta_label(name)}"],
            "target_label": meta_label(name),
            "regex": "(.+)",
            "replacement": "${1}",
        }
        for name in spec.get("podTargetLabels", [])
    ]


def _job_kind(monitor: dict[str, Any]) -> str:
    return monitor["kind"][0].lower() + monitor["kind"][1:]


def prometheus_config(
    discovery_url: str, rules_path: Path, interval: str = LOCAL_INTERVAL
) -> dict[str, Any]:
    """prometheus.yml: every shipped monitor's scrape_configs and the shipped rules."""
    monitors = shipped("ServiceMonitor") + shipped("PodMonitor")
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(rules_path)],
        "scrape_configs": [
            config
            for monitor in monitors
            for config in scrape_configs(monitor, discovery_url, interval)
        ],
    }


def write(folder: Path, discovery_url: str) -> Path:
    """Write the rules file and prometheus.yml into ``folder``; returns prometheus.yml."""
    folder.mkdir(parents=True, exist_ok=True)
    rules_path = folder / "rules.yaml"
    rules_path.write_text(yaml.safe_dump(rules(), sort_keys=False))
    config_path = folder / "prometheus.yml"
    config = prometheus_config(discovery_url, rules_path)
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    return config_path


# PromQL words that are neither metrics nor labels: set operators and modifiers.
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "group_left", "group_right"}
# What in an expression is not a metric name: strings, label matchers, ranges, and the
# label lists of `by`, `without`, `on`, `ignoring`, `group_left` and `group_right`.
_NOT_METRICS = re.compile(
    r'"[^"]*"|\{[^}]*\}|\[[^\]]*\]'
    r"|\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"
)
# An identifier that is not a function call.
_NAME = re.compile(r"\b[a-zA-Z_:][\w:]*\b(?!\s*\()")
# A query an annotation's template runs: {{ ... printf "<query>" ... | query }}.
_TEMPLATE_QUERY = re.compile(r'printf\s+"([^"]*)"[^}]*\|\s*query')


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects."""
    return {name for name in _NAME.findall(_NOT_METRICS.sub(" ", expr)) if name not in _KEYWORDS}


def rule_metrics() -> dict[str, set[str]]:
    """Each alert's metric names: its expression's and those its annotations query, with
    a recording rule's series replaced by the metrics its own expression reads (a recorded
    series exists only when they are scraped)."""
    rules_ = [rule for group in rules()["groups"] for rule in group["rules"]]
    recorded = {rule["record"]: metric_names(rule["expr"]) for rule in rules_ if "record" in rule}

    def scraped(names: set[str]) -> set[str]:
        return set().union(
            *({name} if name not in recorded else scraped(recorded[name]) for name in names)
        )

    used = {}
    for rule in rules_:
        if "alert" not in rule:
            continue
        queries = [
            query
            for text in (rule.get("annotations") or {}).values()
            for query in _TEMPLATE_QUERY.findall(text)
        ]
        used[rule["alert"]] = scraped(set().union(*map(metric_names, [rule["expr"], *queries])))
    return used
