"""Where a Service of the local cluster really answers.

Pods on KWOK nodes never run, so the local runtime starts their processes on loopback ports
and publishes `<service>.<namespace>_<port>` → `http://127.0.0.1:<local port>` (and each
engine pod's own URL, `pod_key`) in one ConfigMap.  The operator, in local mode, resolves Service URLs through it instead of DNS.

A local process that stands in for a pod nobody runs here publishes itself in a second map
of the same keys, `STAND_INS` (the runtime rewrites its own map whole): the development
launcher of the operator (`dsv4-operator-dev run --local-endpoints`) as the local endpoint of
the operator's metrics Service, where the local Prometheus scrapes it.
"""

from __future__ import annotations

from typing import Any

NAMESPACE = "default"
NAME = "dsv4-local-endpoints"
STAND_INS = "dsv4-local-stand-ins"
_POD = "_pod."


def key(service: str, namespace: str, port: int) -> str:
    return f"{service}.{namespace}_{port}"  # ConfigMap keys allow [-._a-zA-Z0-9]


def pod_key(pod: str, namespace: str) -> str:
    """An engine pod's own entry (its metrics, as a scrape reaches each pod): no Service name
    starts with "_", so it never collides with `key`."""
    return f"{_POD}{pod}.{namespace}"


def service_of(key_: str) -> tuple[str, str, int] | None:
    """(service, namespace, port) of a Service's key; None for an engine pod's own."""
    if key_.startswith(_POD):
        return None
    name, port = key_.rsplit("_", 1)
    service, namespace = name.split(".", 1)  # neither a Service nor a namespace has a "."
    return service, namespace, int(port)


def label(key_: str) -> str:
    """A map key as a person reads it: `pod/<pod>.<namespace>` or
    `service/<service>.<namespace>:<port>`."""
    found = service_of(key_)
    if found is None:
        return f"pod/{key_.removeprefix(_POD)}"
    service, namespace, port = found
    return f"service/{service}.{namespace}:{port}"


def resolver(kube: Any) -> Any:
    """A `ServiceUrl` reading the published map; an unpublished Service is unreachable."""

    def service_url(namespace: str, service: str, port: int) -> str:
        config_map = kube.get("ConfigMap", NAMESPACE, NAME) or {}
        url = (config_map.get("data") or {}).get(key(service, namespace, port))
        if url is None:
            raise ValueError(f"{service}.{namespace}:{port} has no local endpoint yet")
        return url

    return service_url
