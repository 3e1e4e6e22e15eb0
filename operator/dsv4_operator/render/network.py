"""Who may reach a slice's engine pods: its NetworkPolicy.

An engine pod serves the raw model (no router in front) and, between engines, the KV
transfer, so it accepts traffic only from
- the engine pods of its own slice, on every port: a decode engine fetches KV pages from a
  prefill engine (its bootstrap port, then the transfer engine's, which Mooncake and NIXL
  pick at run time), and a multi-node replica's ranks meet on the dist-init port;
- its slice's routers, and its deployment's probe Jobs, on the engine's HTTP port;
- pods labelled `SCRAPER_LABEL: "true"` in a namespace labelled
  `SCRAPER_NAMESPACE_LABEL: "true"` (a Prometheus that scrapes the engines' own `/metrics`),
  on that port too.  The pod label is anyone's to set in their own namespace; the namespace
  label is the cluster administrator's (tenants with `edit` or `admin` cannot patch their
  Namespace), so a tenant's pod labelled as a scraper reaches no engine, and SGLang's admin
  endpoints (weight updates, pause, memory release) stay out of its reach.
The stable slice and the canary each have their own: neither reaches the other's engines.
The operator itself needs nothing here: it reads readiness from the API, never from a pod.
Routers are not restricted (clients of the deployment reach them through its Service).
"""

from __future__ import annotations

from typing import Any

from dsv4_engine.features import Role
from dsv4_operator.api.names import CANARY_SUFFIX
from dsv4_operator.render.engine import ENGINE_PORT
from dsv4_operator.render.meta import (
    APP,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_NAME,
    PROBE_COMPONENT,
    Owner,
    metadata,
)
from dsv4_operator.render.router import COMPONENT as ROUTER

COMPONENT = "network-policy"
SCRAPER_LABEL = "inference.dsv4.dev/engine-scraper"
SCRAPER_NAMESPACE_LABEL = "inference.dsv4.dev/engine-scrapers"
ENGINES = sorted(role.value for role in Role)


def policy_name(owner: Owner) -> str:
    return f"{owner.name}-engines"


def _pods(instance: str, *components: str) -> dict[str, Any]:
    return {
        "podSelector": {
            "matchLabels": {LABEL_NAME: APP, LABEL_INSTANCE: instance},
            "matchExpressions": [
                {"key": LABEL_COMPONENT, "operator": "In", "values": list(components)}
            ],
        }
    }


def engine_network_policy(owner: Owner) -> dict[str, Any]:
    """The policy of ``owner``'s slice (a deployment, or its canary `<name>--canary`,
    whose probe Jobs are the deployment's: they carry its name)."""
    deployment = owner.name.removesuffix(CANARY_SUFFIX)
    http = [{"protocol": "TCP", "port": ENGINE_PORT}]
    scrapers = {
        "namespaceSelector": {"matchLabels": {SCRAPER_NAMESPACE_LABEL: "true"}},
        "podSelector": {"matchLabels": {SCRAPER_LABEL: "true"}},
    }
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(owner, policy_name(owner), COMPONENT),
        "spec": {
            "podSelector": _pods(owner.name, *ENGINES)["podSelector"],
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [_pods(owner.name, *ENGINES)]},
                {
                    "from": [
                        _pods(owner.name, ROUTER),
                        _pods(deployment, PROBE_COMPONENT),
                        scrapers,
                    ],
                    "ports": http,
                },
            ],
        },
    }
