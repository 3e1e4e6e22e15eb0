"""Who reaches a slice's engines: its NetworkPolicy, evaluated against the pods the operator
itself renders (engines and routers of both slices, a probe Job), with the API's selector
semantics (matchLabels and `In` expressions, all of them, on the pod's labels)."""

from __future__ import annotations

from typing import Any

import pytest

from dsv4_engine.probe import ProbeSettings
from dsv4_operator.api.rollout import RolloutStatus
from dsv4_operator.api.samples import load_sample
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.render import render_all
from dsv4_operator.render.engine import ENGINE_PORT
from dsv4_operator.render.memory import pod_memory
from dsv4_operator.render.meta import Owner
from dsv4_operator.render.network import SCRAPER_LABEL, SCRAPER_NAMESPACE_LABEL, policy_name
from dsv4_operator.rollout.probe_job import probe_job
from dsv4_operator.rollout.slices import canary_objects, spec_revision

OWNER = Owner(name="flash", namespace="serving", uid="uid-1")
SPEC = DSV4DeploymentSpec.model_validate(load_sample()["spec"])
OTHER_NS = {"kubernetes.io/metadata.name": "tenant-b"}
SCRAPERS_NS = {"kubernetes.io/metadata.name": "monitoring", SCRAPER_NAMESPACE_LABEL: "true"}


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    expressions = selector.get("matchExpressions", [])
    assert all(e["operator"] == "In" for e in expressions), "teach this test the operator"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items()) and all(
        labels.get(e["key"]) in e["values"] for e in expressions
    )


def admitted(policy: dict[str, Any], labels: dict[str, str], ns: dict[str, str] | None) -> set:
    """Ports (None: every port) a pod with ``labels`` may open to the policy's pods;
    ``ns``: the labels of its namespace when it is not the policy's own."""
    ports: set[int | None] = set()
    for rule in policy["spec"]["ingress"]:
        for peer in rule["from"]:
            if "namespaceSelector" in peer:
                if not selects(peer["namespaceSelector"], ns or {}):
                    continue
            elif ns is not None:
                continue  # a bare podSelector means the policy's namespace
            if selects(peer["podSelector"], labels):
                ports |= {p["port"] for p in rule.get("ports", [])} or {None}
    return ports


def pods(objects: list[dict[str, Any]], kind: str) -> list[dict[str, str]]:
    return [o["spec"]["template"]["metadata"]["labels"] for o in objects if o["kind"] == kind]


def slice_objects() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    stable = spec_revision(SPEC)
    status = RolloutStatus(
        stable=stable,
        stable_revision=stable.revision,
        canary=stable.model_copy(update={"image": "engine:next"}),
    )
    canary = canary_objects(OWNER, SPEC, status, pod_memory)
    return render_all(OWNER, SPEC), canary


def policy(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == "NetworkPolicy"]
    return found


def probe_pod() -> dict[str, str]:
    report = {"metadata": {"name": "flash-canary-ab12cd34-1", "uid": "uid-r"}}
    settings = ProbeSettings(base_url="http://flash--canary-router.serving.svc:8000")
    job = probe_job(OWNER, report, "canary", settings, "image")
    return job["spec"]["template"]["metadata"]["labels"]


def test_each_slice_fences_exactly_its_own_engine_pods():
    stable, canary = slice_objects()
    for mine, theirs in ((stable, canary), (canary, stable)):
        fence = policy(mine)
        assert fence["spec"]["policyTypes"] == ["Ingress"]
        selected = fence["spec"]["podSelector"]
        assert all(selects(selected, p) for p in pods(mine, "StatefulSet"))
        assert pods(mine, "StatefulSet") and pods(mine, "Deployment")
        assert not any(selects(selected, p) for p in pods(mine, "Deployment"))  # routers
        assert not any(selects(selected, p) for p in pods(theirs, "StatefulSet"))
    assert policy(stable)["metadata"]["name"] == policy_name(OWNER) == "flash-engines"


def test_engines_reach_their_peers_on_every_port_and_routers_probes_only_http():
    stable, canary = slice_objects()
    for mine, theirs in ((stable, canary), (canary, stable)):
        fence = policy(mine)
        for engine in pods(mine, "StatefulSet"):  # KV transfer, bootstrap, dist-init
            assert admitted(fence, engine, None) == {None}
        for router in pods(mine, "Deployment"):
            assert admitted(fence, router, None) == {ENGINE_PORT}
        assert admitted(fence, probe_pod(), None) == {ENGINE_PORT}
        # The other slice's engines and routers are strangers.
        for stranger in pods(theirs, "StatefulSet") + pods(theirs, "Deployment"):
            assert admitted(fence, stranger, None) == set()


@pytest.mark.parametrize(
    ("labels", "ns", "ports"),
    [
        ({SCRAPER_LABEL: "true"}, SCRAPERS_NS, {ENGINE_PORT}),  # the admin's Prometheus
        # The review's escape: a tenant labels its own pod a scraper, in its namespace or in
        # the deployment's; neither namespace carries the administrator's label.
        ({SCRAPER_LABEL: "true"}, OTHER_NS, set()),
        ({SCRAPER_LABEL: "true"}, None, set()),
        ({"app": "anything-else"}, None, set()),
        (
            {"app.kubernetes.io/name": "dsv4-operator"},
            {"kubernetes.io/metadata.name": "dsv4-system"},
            set(),
        ),  # fmt: skip
    ],
)
def test_anyone_else_reaches_only_the_metrics_port_and_only_as_a_scraper(labels, ns, ports):
    stable, _ = slice_objects()
    assert admitted(policy(stable), labels, ns) == ports


def test_probes_of_another_deployment_are_strangers():
    stable, _ = slice_objects()
    other = {**probe_pod(), "app.kubernetes.io/instance": "pro"}
    assert admitted(policy(stable), other, None) == set()
