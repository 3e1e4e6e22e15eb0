"""manifests/base grants the operator exactly the API access its code makes, no more.

The needed access is read from the code (tests/unit/install/rbac_from_code.py): every
`kube.<method>(...)` call, the watches kopf opens, kopf's CRD scanning, and the rules of
the shipped ClusterRoles it binds (which the API server lets it grant only if it holds
them).  The end-to-end install test proves the same set is enough on a real API
server (no 403 in the audit log).
"""

import ast
import importlib
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from dsv4_operator.render.router import ROUTER_CLUSTER_ROLE, ROUTER_RULES
from dsv4_operator.rollout.probe_job import PROBE_CLUSTER_ROLE, PROBE_RULES
from dsv4_operator.runtime import parse_args
from tests.unit.install import rbac_from_code as code

ROOT = Path(__file__).resolve().parents[3]
WRITES = ("create", "update", "patch", "delete")
BASE = ROOT / "manifests" / "base"


def load(name):
    return [d for d in yaml.safe_load_all((BASE / name).read_text()) if d]


@pytest.fixture(scope="module")
def rbac():
    return {(d["kind"], d["metadata"]["name"]): d for d in load("rbac.yaml")}


def one(rbac, kind, name=None):
    (obj,) = [o for (k, n), o in rbac.items() if k == kind and name in (None, n)]
    return obj


def test_every_request_method_of_kube_has_a_known_rbac_verb():
    # A new Kube method must be mapped before the RBAC check can account for its calls.
    assert code.request_methods() == set(code.KUBE_VERBS)


def test_the_cluster_role_grants_exactly_what_the_code_uses(rbac):
    needed = {a for a in code.needed() if a.scope == "cluster"}
    granted = code.granted(one(rbac, "ClusterRole", "dsv4-operator")["rules"], "cluster")
    assert sorted(granted - needed, key=str) == [], "granted but never used"
    assert sorted(needed - granted, key=str) == [], "used but not granted"


def test_the_namespaced_role_grants_exactly_leader_election(rbac):
    needed = {a for a in code.needed() if a.scope == "namespace"}
    granted = code.granted(one(rbac, "Role")["rules"], "namespace")
    assert granted == needed
    assert {a.resource for a in granted} == {"leases"}


def test_no_wildcards_and_no_secrets(rbac):
    for obj in rbac.values():
        for rule in obj.get("rules", []):
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], (obj["metadata"]["name"], rule)
            assert "secrets" not in rule["resources"]
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])


def test_the_bindings_bind_the_deployments_service_account(rbac):
    (account,) = load("serviceaccount.yaml")
    (deployment,) = load("deployment.yaml")
    assert (
        deployment["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
    )
    for kind, role_kind in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        binding = one(rbac, kind)
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role_kind,
            "name": one(rbac, role_kind, "dsv4-operator" if role_kind == "ClusterRole" else None)[
                "metadata"
            ]["name"],
        }
        assert binding["subjects"] == [
            {
                "kind": "ServiceAccount",
                "name": account["metadata"]["name"],
                "namespace": "dsv4-system",
            }
        ]


def test_the_derivation_sees_the_calls_it_claims_to(rbac):
    """Guards the guard: known calls of the reconciler and leader election are found."""
    needed = code.needed()
    for access in [
        code.Access("cluster", "", "nodes", "watch"),  # check_prerequisites, from the cache
        code.Access("cluster", "", "persistentvolumeclaims", "list"),
        code.Access("cluster", "", "events", "create"),  # one Event per decision
        code.Access("cluster", "", "events", "patch"),  # ... and a repeat counted on it
        code.Access("cluster", "apps", "statefulsets", "create"),  # SSA of a missing child
        code.Access("cluster", "apps", "statefulsets", "delete"),  # an orphaned child
        code.Access("cluster", "inference.dsv4.dev", "dsv4deployments/status", "patch"),
        code.Access("cluster", "inference.dsv4.dev", "dsv4deployments", "watch"),  # kopf
        code.Access("cluster", "", "pods", "watch"),  # the router's ClusterRole, bound
        code.Access("namespace", "coordination.k8s.io", "leases", "update"),
        code.Access("cluster", "apps", "statefulsets", "watch"),  # others' names, from the cache
        code.Access("cluster", "", "configmaps", "patch"),  # dsv4-probe, bound (and reports)
        code.Access("cluster", "rbac.authorization.k8s.io", "rolebindings", "create"),
    ]:
        assert access in needed, access
    # Never written: the resource itself (controls are remembered in its status), Roles.
    for access in [
        *(code.Access("cluster", "inference.dsv4.dev", "dsv4deployments", v) for v in WRITES),
        *(code.Access("cluster", "rbac.authorization.k8s.io", "roles", v) for v in WRITES),
    ]:
        assert access not in needed, access


def test_the_shipped_cluster_roles_are_the_ones_the_code_binds(rbac):
    assert code.SHIPPED_CLUSTER_ROLES == {
        ROUTER_CLUSTER_ROLE: ROUTER_RULES,
        PROBE_CLUSTER_ROLE: PROBE_RULES,
    }
    for name, rules in code.SHIPPED_CLUSTER_ROLES.items():
        assert one(rbac, "ClusterRole", name)["rules"] == rules


def test_an_unresolvable_call_names_its_file_and_line():
    source = "def f(kube, kinds):\n    return [kube.get(k, 'ns', 'n') for k in kinds]\n"
    resolver = code._Resolver(code.PACKAGE / "fake.py", ModuleType("fake"), ast.parse(source))
    call = next(n for n in ast.walk(resolver.tree) if code._is_kube_call(n))
    with pytest.raises(code.UnresolvedAccess, match=r"dsv4_operator/fake.py:2: cannot tell"):
        resolver.kind_argument(call.args[0])


def test_the_lease_can_only_be_read_and_renewed_by_the_name_the_operator_uses(rbac):
    (deployment,) = load("deployment.yaml")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    lease_name = parse_args(container["args"]).lease_name
    for rule in one(rbac, "Role")["rules"]:
        if set(rule["verbs"]) - {"create"}:
            assert rule["resourceNames"] == [lease_name], rule


FILER = """
import asyncio


def report(name):
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}


class Filer:
    def __init__(self, loop, apply):
        self._apply = apply

    async def run(self):
        await asyncio.to_thread(self._apply, report("x"))


def wire(kube):
    return Filer(None, apply=kube.apply)
"""


def test_a_kube_method_handed_to_a_class_is_followed_to_its_calls(tmp_path, monkeypatch):
    (tmp_path / "fake_filer.py").write_text(FILER)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("fake_filer")
    resolver = code._Resolver(tmp_path / "fake_filer.py", module, ast.parse(FILER))
    (ref,) = [n for n in ast.walk(resolver.tree) if code._is_kube_reference(n, resolver.parents)]
    assert resolver.callback_kinds(ref) == {"ConfigMap"}
