"""manifests/namespaced grants the operator what its code uses, split by scope: in its
watched namespace the namespaced part (a Role), cluster-wide only a list of nodes, in its
own namespace its Lease and its own pod.  And the admission fence
shipped with every install covers every kind the operator writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dsv4_operator.kube.client import RESOURCES
from dsv4_operator.runtime import parse_args
from tests.unit.install import rbac_from_code as code

ROOT = Path(__file__).resolve().parents[3]
MANIFESTS = ROOT / "manifests"
NAMESPACED = MANIFESTS / "namespaced"
OPERATOR_NS = "dsv4-system"
SERVING_NS = "dsv4-serving"
# What has no namespace: the cluster-scoped kinds the operator reads, and the CRDs kopf scans.
CLUSTER_SCOPED = {r.plural for r in RESOURCES.values() if not r.namespaced} | {
    "customresourcedefinitions"
}
# Writes the fence leaves alone, each for its reason: the user's own DSV4Deployment (the
# operator reads it and writes its status only), its Events
# (no labels to check), its Lease (in its own namespace, by name).
UNFENCED = {"dsv4deployments", "dsv4deployments/status", "events", "leases"}
WRITES = {"create", "patch", "update", "delete"}


def load(*parts: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(MANIFESTS.joinpath(*parts).read_text()) if d]


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    return found


def accesses(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(a.group, a.resource, a.verb) for a in code.granted(rules, "cluster")}


@pytest.fixture(scope="module")
def needed() -> set[tuple[str, str, str]]:
    return {(a.group, a.resource, a.verb) for a in code.needed() if a.scope == "cluster"}


def test_cluster_wide_it_may_only_list_and_watch_nodes(needed):
    """Limited to namespaces, kopf does not scan (CRDs, namespaces): nodes are left, listed
    and watched (metadata only) into the cache passes read."""
    (patch,) = load("namespaced", "cluster-role.yaml")  # replaces base's rules whole
    scanning = {(a.group, a.resource, a.verb) for a in code.kopf_scanning()}
    assert scanning, "kopf scans cluster-wide; the namespaced install relies on it not"
    granted = accesses(patch["rules"])
    assert granted == {a for a in needed if a[1] in CLUSTER_SCOPED} - scanning
    assert granted == {("", "nodes", "list"), ("", "nodes", "watch")}


def test_in_the_watched_namespace_a_role_grants_the_rest(needed):
    serving = load("namespaced", "serving.yaml")
    role = one(serving, "Role")
    assert role["metadata"]["namespace"] == SERVING_NS
    assert accesses(role["rules"]) == {a for a in needed if a[1] not in CLUSTER_SCOPED}
    binding = one(serving, "RoleBinding")
    assert binding["metadata"]["namespace"] == SERVING_NS
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "dsv4-operator", "namespace": OPERATOR_NS}
    ]
    namespace = one(serving, "Namespace")
    assert namespace["metadata"]["name"] == SERVING_NS
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_in_its_own_namespace_it_reads_only_its_own_pod_beyond_its_lease():
    self_role = one(load("namespaced", "self.yaml"), "Role")
    assert self_role["metadata"]["namespace"] == OPERATOR_NS
    assert accesses(self_role["rules"]) == {("", "pods", "get")}


def test_the_operator_watches_exactly_the_namespace_it_is_granted():
    (deployment,) = load("base", "deployment.yaml")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    kustomization = yaml.safe_load((NAMESPACED / "kustomization.yaml").read_text())
    (json_patch,) = [p for p in kustomization["patches"] if "patch" in p]
    added = [op["value"] for op in yaml.safe_load(json_patch["patch"])]
    assert parse_args([*container["args"], *added]).namespace == [SERVING_NS]


def fenced(policy: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (group, resource)
        for rule in policy["spec"]["matchConstraints"]["resourceRules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        if set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"}
    }


def test_the_fence_covers_every_kind_the_operator_writes_and_binds_its_account(needed):
    policy = one(load("base", "fence.yaml"), "ValidatingAdmissionPolicy", "dsv4-operator-fence")
    written = {(g, r) for g, r, verb in needed if verb in WRITES and r not in UNFENCED}
    assert written and written <= fenced(policy)
    (condition,) = policy["spec"]["matchConditions"]
    account = one(load("base", "serviceaccount.yaml"), "ServiceAccount")["metadata"]
    assert (
        f'"system:serviceaccount:{account["namespace"]}:{account["name"]}"'
        in (condition["expression"])
    )
    bindings = [o for o in load("base", "fence.yaml") if o["kind"].endswith("PolicyBinding")]
    policies = [o for o in load("base", "fence.yaml") if o["kind"].endswith("Policy")]
    assert sorted((b["spec"]["policyName"], b["spec"]["validationActions"]) for b in bindings) == (
        sorted((p["metadata"]["name"], ["Deny"]) for p in policies)
    )
