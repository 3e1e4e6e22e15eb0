"""Kubernetes service discovery for the local Prometheus, served as HTTP SD.

Debian's Prometheus is built without `kubernetes_sd_configs`, so this serves what it would
discover, from the same place: each request lists the pods, Services and EndpointSlices of
the cluster's API server and answers with the targets of one role (`/targets/pod`,
`/targets/endpointslice`, optionally `?namespace=…` repeated), each labelled with the
`__meta_kubernetes_*` labels Prometheus's own Kubernetes discovery gives it.  Which of them
are scraped is then decided by the relabelling generated from the shipped monitors
(`config`), inside Prometheus, exactly as in a cluster.

The one difference is a target's address.  KWOK gives pods made-up IPs where nothing
listens; a pod that a local process plays is reached at that process instead: an engine
pod's `http` port at the engine the local runtime runs for it (its own entry in the endpoint
map), and a pod of a Service published whole (the operator's pod, for which the development
launcher stands in) at the Service's local endpoint.  Every other target keeps its pod IP,
and its scrape fails (`up` 0), as a scrape of a pod that does not answer does.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from dsv4_dev.localrun import endpoints
from dsv4_dev.monitoring.config import ROLES, meta_label

log = logging.getLogger("dsv4_dev.monitoring")
SERVICE_NAME_LABEL = "kubernetes.io/service-name"  # an EndpointSlice's Service

Objects = dict[str, list[dict[str, Any]]]  # kind -> the cluster's objects of that kind


def _labels(prefix: str, labels: dict[str, str]) -> dict[str, str]:
    out = {}
    for key, value in labels.items():
        out[f"{prefix}_label_{meta_label(key)}"] = value
        out[f"{prefix}_labelpresent_{meta_label(key)}"] = "true"
    return out


def _pod_meta(pod: dict[str, Any]) -> dict[str, str]:
    meta, status = pod["metadata"], pod.get("status") or {}
    conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
    return {
        "__meta_kubernetes_namespace": meta["namespace"],
        "__meta_kubernetes_pod_name": meta["name"],
        "__meta_kubernetes_pod_uid": meta.get("uid", ""),
        "__meta_kubernetes_pod_ip": status.get("podIP", ""),
        "__meta_kubernetes_pod_phase": status.get("phase", ""),
        "__meta_kubernetes_pod_ready": conditions.get("Ready", "unknown").lower(),
        "__meta_kubernetes_pod_node_name": pod["spec"].get("nodeName", ""),
        **_labels("__meta_kubernetes_pod", meta.get("labels") or {}),
    }


def _container_port(pod: dict[str, Any], number: int) -> tuple[dict, dict] | None:
    """(container, port) of the pod that declares port ``number``."""
    for container in pod["spec"]["containers"]:
        for port in container.get("ports") or []:
            if port["containerPort"] == number:
                return container, port
    return None


def _port_meta(container: dict[str, Any], port: dict[str, Any]) -> dict[str, str]:
    return {
        "__meta_kubernetes_pod_container_name": container["name"],
        "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
        "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
        "__meta_kubernetes_pod_container_port_protocol": port.get("protocol", "TCP"),
    }


def _target_port(pod: dict[str, Any], service_port: dict[str, Any]) -> int | None:
    """The pod's port a Service port sends to (a number, or a named container port)."""
    target = service_port.get("targetPort", service_port["port"])
    if isinstance(target, int):
        return target
    for container in pod["spec"]["containers"]:
        for port in container.get("ports") or []:
            if port.get("name") == target:
                return port["containerPort"]
    return None


def local_address(
    pod: dict[str, Any], number: int, services: list[dict[str, Any]], published: dict[str, str]
) -> str | None:
    """Where the local process playing ``pod`` answers for its port ``number``, if one does."""
    namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    labels = pod["metadata"].get("labels") or {}
    found = _container_port(pod, number)
    own = published.get(endpoints.pod_key(name, namespace))
    if own is not None and found is not None and found[1].get("name") == "http":
        return urlsplit(own).netloc
    for service in services:
        selector = service["spec"].get("selector") or {}
        if service["metadata"]["namespace"] != namespace or not selector.items() <= labels.items():
            continue
        for port in service["spec"].get("ports") or []:
            url = published.get(endpoints.key(service["metadata"]["name"], namespace, port["port"]))
            if url is not None and _target_port(pod, port) == number:
                return urlsplit(url).netloc
    return None


def _address(pod: dict[str, Any], number: int, objects: Objects, published: dict[str, str]) -> str:
    local = local_address(pod, number, objects["Service"], published)
    return local or f"{pod.get('status', {}).get('podIP', '')}:{number}"


def pod_targets(objects: Objects, published: dict[str, str]) -> list[dict[str, Any]]:
    """Role `pod`: one target per declared port of each pod's containers."""
    groups = []
    for pod in objects["Pod"]:
        for container in pod["spec"]["containers"]:
            for port in container.get("ports") or []:
                labels = {**_pod_meta(pod), **_port_meta(container, port)}
                address = _address(pod, port["containerPort"], objects, published)
                groups.append({"targets": [address], "labels": labels})
    return groups


def endpointslice_targets(objects: Objects, published: dict[str, str]) -> list[dict[str, Any]]:
    """Role `endpointslice`: one target per endpoint and port of each Service's slices, with
    the Service's labels and, for a pod, the pod's."""
    services = {(s["metadata"]["namespace"], s["metadata"]["name"]): s for s in objects["Service"]}
    pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in objects["Pod"]}
    groups = []
    for piece in objects["EndpointSlice"]:
        namespace = piece["metadata"]["namespace"]
        service_name = (piece["metadata"].get("labels") or {}).get(SERVICE_NAME_LABEL, "")
        service = services.get((namespace, service_name))
        if service is None:
            continue
        common = {
            "__meta_kubernetes_namespace": namespace,
            "__meta_kubernetes_endpointslice_name": piece["metadata"]["name"],
            "__meta_kubernetes_service_name": service_name,
            **_labels("__meta_kubernetes_service", service["metadata"].get("labels") or {}),
        }
        for endpoint in piece.get("endpoints") or []:
            ref = endpoint.get("targetRef") or {}
            pod = pods.get((namespace, ref.get("name", ""))) if ref.get("kind") == "Pod" else None
            ready = (endpoint.get("conditions") or {}).get("ready", False)
            for port in piece.get("ports") or []:
                labels = {
                    **common,
                    "__meta_kubernetes_endpointslice_address_target_kind": ref.get("kind", ""),
                    "__meta_kubernetes_endpointslice_address_target_name": ref.get("name", ""),
                    "__meta_kubernetes_endpointslice_endpoint_conditions_ready": str(ready).lower(),
                    "__meta_kubernetes_endpointslice_port_name": port.get("name", ""),
                    "__meta_kubernetes_endpointslice_port_number": str(port["port"]),
                    "__meta_kubernetes_endpointslice_port_protocol": port.get("protocol", "TCP"),
                }
                address = f"{endpoint['addresses'][0]}:{port['port']}"
                if pod is not None:
                    labels.update(_pod_meta(pod))
                    if (found := _container_port(pod, port["port"])) is not None:
                        labels.update(_port_meta(*found))
                    address = _address(pod, port["port"], objects, published)
                groups.append({"targets": [address], "labels": labels})
    return groups


TARGETS: dict[str, Callable[[Objects, dict[str, str]], list[dict[str, Any]]]] = {
    "pod": pod_targets,
    "endpointslice": endpointslice_targets,
}
assert set(TARGETS) == set(ROLES)


def discover(kube: Any, role: str, namespaces: list[str]) -> list[dict[str, Any]]:
    """The targets of ``role`` in ``namespaces`` (all when empty), read from the cluster."""
    scopes = namespaces or [None]
    objects = {
        kind: [obj for namespace in scopes for obj in kube.list(kind, namespace)]
        for kind in ("Pod", "Service", "EndpointSlice")
    }
    published: dict[str, str] = {}
    for name in (endpoints.STAND_INS, endpoints.NAME):  # the runtime's entries win
        published.update((kube.get("ConfigMap", endpoints.NAMESPACE, name) or {}).get("data") or {})
    return TARGETS[role](objects, published)


def server(port: int, kube: Any) -> HTTPServer:
    """The HTTP SD endpoint on loopback ``port`` (serve it with `serve_forever`)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            url = urlsplit(self.path)
            role = url.path.removeprefix("/targets/")
            if role not in TARGETS:
                self.send_error(404, f"no role {role!r}; roles: {', '.join(TARGETS)}")
                return
            namespaces = parse_qs(url.query).get("namespace", [])
            try:
                body = json.dumps(discover(kube, role, namespaces)).encode()
            except Exception as err:  # noqa: BLE001 - Prometheus keeps the last targets
                log.warning("discovery of %s failed: %s", role, err)
                self.send_error(503, str(err))
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:  # Prometheus asks every interval: no log
            return

    return HTTPServer(("127.0.0.1", port), Handler)
