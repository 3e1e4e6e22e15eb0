"""The admission fence's two policies and its settings line up with the operator.

What the fence refuses is shown against the real API server (tests/e2e/test_install.py,
tests/e2e/test_namespaced_install.py); here, what must agree for that to hold: the two
policies read the same pod templates, the operator takes its allowed model paths from the
ConfigMap the fence reads, and the accounts policy's params are exactly the
ServiceAccounts the operator did not label as its own.
"""

from __future__ import annotations

import pytest

from dsv4_operator.api import host_paths
from dsv4_operator.render.meta import LABEL_MANAGED_BY, MANAGED_BY
from dsv4_operator.runtime import parse_args
from tests.unit.install.test_install_namespaced import OPERATOR_NS, SERVING_NS, load, one

FENCE = load("base", "fence.yaml")
POLICY = one(FENCE, "ValidatingAdmissionPolicy", "dsv4-operator-fence")
ACCOUNTS = one(FENCE, "ValidatingAdmissionPolicy", "dsv4-operator-fence-accounts")
SETTINGS = one(FENCE, "ConfigMap", "dsv4-operator-settings")


def variable(policy: dict, name: str) -> str:
    (found,) = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == name]
    return found


def test_both_policies_read_the_same_pod_templates_of_the_same_account():
    assert variable(ACCOUNTS, "podSpecs") == variable(POLICY, "podSpecs")
    assert ACCOUNTS["spec"]["matchConditions"] == POLICY["spec"]["matchConditions"]
    workloads = {
        (group, resource)
        for rule in ACCOUNTS["spec"]["matchConstraints"]["resourceRules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert workloads == {
        ("", "pods"),
        ("apps", "deployments"),
        ("apps", "statefulsets"),
        ("batch", "jobs"),
        ("leaderworkerset.x-k8s.io", "leaderworkersets"),
    }


def test_the_accounts_policy_takes_every_account_the_operator_did_not_label():
    binding = one(FENCE, "ValidatingAdmissionPolicyBinding", "dsv4-operator-fence-accounts")
    ref = binding["spec"]["paramRef"]
    assert "namespace" not in ref  # the request's own namespace
    assert ref["selector"] == {
        "matchExpressions": [{"key": LABEL_MANAGED_BY, "operator": "NotIn", "values": [MANAGED_BY]}]
    }
    assert ACCOUNTS["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "ServiceAccount"}


def test_the_operator_allows_the_model_host_paths_the_fence_allows(monkeypatch):
    binding = one(FENCE, "ValidatingAdmissionPolicyBinding", "dsv4-operator-fence")
    assert binding["spec"]["paramRef"] == {
        "name": SETTINGS["metadata"]["name"],
        "namespace": OPERATOR_NS,
        "parameterNotFoundAction": "Deny",
    }
    (key,) = SETTINGS["data"]
    assert f"'{key}' in params.data" in variable(POLICY, "modelHostPaths")
    (deployment,) = load("base", "deployment.yaml")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env[host_paths.ENV]["valueFrom"]["configMapKeyRef"] == {
        "name": SETTINGS["metadata"]["name"],
        "key": key,
    }
    assert host_paths.FLAG not in container["args"]  # the env default decides
    monkeypatch.setenv(host_paths.ENV, SETTINGS["data"][key])
    assert parse_args(container["args"]).allowed_model_host_paths == ()  # none shipped
    monkeypatch.setenv(host_paths.ENV, "/data/models, /mnt/weights/")
    assert parse_args(container["args"]).allowed_model_host_paths == (
        "/data/models",
        "/mnt/weights",
    )
    monkeypatch.setenv(host_paths.ENV, "relative/path")
    with pytest.raises(SystemExit):
        parse_args(container["args"])


def test_the_namespaced_install_labels_its_namespace_served():
    served = variable(POLICY, "served").strip("'")
    namespace = one(load("namespaced", "serving.yaml"), "Namespace")
    assert namespace["metadata"]["name"] == SERVING_NS
    assert namespace["metadata"]["labels"][served] == "true"
