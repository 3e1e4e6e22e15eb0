"""The admission fence's policies and its settings line up with the operator.

What the fence refuses is shown against the real API server (tests/e2e/test_install.py,
tests/e2e/test_namespaced_install.py); here, what must agree for that to hold: the two
policies read the same pod templates, the operator takes its allowed model paths from the
ConfigMap the fence reads, and the accounts policy's params are exactly the
ServiceAccounts the operator did not label as its own; the probe fence names the labels,
keys and annotations the code writes, and its params are the accounts the operator makes
for probes.
"""

from __future__ import annotations

import pytest

from dsv4_engine.probe import ProbeSettings
from dsv4_operator.api import allowed, host_paths
from dsv4_operator.render.meta import (
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    REPORT_COMPONENT,
    Owner,
)
from dsv4_operator.render.router import router_shared
from dsv4_operator.render.workloads import OWN_RESOURCES
from dsv4_operator.rollout import manual, reports
from dsv4_operator.rollout.decide import ManualAction
from dsv4_operator.rollout.probe_job import PROBE_CLUSTER_ROLE, probe_identity, probe_job
from dsv4_operator.runtime import allowed_by, parse_args
from tests.unit.install.rendered import SAMPLES, pod_templates, rendered
from tests.unit.install.test_install_namespaced import OPERATOR_NS, SERVING_NS, load, one

FENCE = load("base", "fence.yaml")
POLICY = one(FENCE, "ValidatingAdmissionPolicy", "dsv4-operator-fence")
ACCOUNTS = one(FENCE, "ValidatingAdmissionPolicy", "dsv4-operator-fence-accounts")
PROBES = one(FENCE, "ValidatingAdmissionPolicy", "dsv4-probe-fence")
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
        ("rbac.authorization.k8s.io", "rolebindings"),  # whom rule 6 binds
    }


def test_the_accounts_policy_takes_every_account_the_operator_did_not_label():
    binding = one(FENCE, "ValidatingAdmissionPolicyBinding", "dsv4-operator-fence-accounts")
    ref = binding["spec"]["paramRef"]
    assert "namespace" not in ref  # the request's own namespace
    assert ref["selector"] == {
        "matchExpressions": [{"key": LABEL_MANAGED_BY, "operator": "NotIn", "values": [MANAGED_BY]}]
    }
    assert ACCOUNTS["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "ServiceAccount"}


# Each setting: its key in the ConfigMap, the fence variable that reads it, the operator's
# environment variable and flag, and what `allowed_by` makes of the shipped value.
SETTINGS_READ = [
    ("allowedModelHostPaths", "modelHostPaths", host_paths.ENV, host_paths.FLAG),
    (allowed.IMAGES_KEY, "allowedImages", allowed.IMAGES_ENV, allowed.IMAGES_FLAG),
    (
        allowed.TOLERATIONS_KEY,
        "allowedTolerations",
        allowed.TOLERATIONS_ENV,
        allowed.TOLERATIONS_FLAG,
    ),
    (allowed.DEVICES_KEY, "allowedDevices", allowed.DEVICES_ENV, allowed.DEVICES_FLAG),
    (
        allowed.PRIORITY_CLASSES_KEY,
        "allowedPriorityClasses",
        allowed.PRIORITY_CLASSES_ENV,
        allowed.PRIORITY_CLASSES_FLAG,
    ),
]


def test_the_fence_admits_the_resources_the_operator_sets_and_the_allowed_devices():
    """The fence's own list is the operator's, and every resource a container of a shipped
    sample asks for (its children, a canary's, a probe Job's) is in it or a shipped device."""
    assert str(list(OWN_RESOURCES)) in variable(POLICY, "refusedResources")
    asked = {
        name
        for sample in SAMPLES
        for _, template in pod_templates(rendered(sample))
        for container in template["spec"]["containers"]
        for kind in ("requests", "limits")
        for name in container.get("resources", {}).get(kind, {})
    }
    devices = asked - set(OWN_RESOURCES)
    assert devices and devices <= set(allowed.SHIPPED.device_resources), devices


def test_the_operator_allows_what_the_fence_allows(monkeypatch):
    """Every key of the settings is read by the fence and, through the installed
    Deployment's environment, by the operator; what is shipped is `api.allowed.SHIPPED`."""
    binding = one(FENCE, "ValidatingAdmissionPolicyBinding", "dsv4-operator-fence")
    assert binding["spec"]["paramRef"] == {
        "name": SETTINGS["metadata"]["name"],
        "namespace": OPERATOR_NS,
        "parameterNotFoundAction": "Deny",
    }
    assert set(SETTINGS["data"]) == {key for key, *_ in SETTINGS_READ}
    (deployment,) = load("base", "deployment.yaml")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    for key, fence_variable, env_name, flag in SETTINGS_READ:
        assert f"'{key}' in params.data" in variable(POLICY, fence_variable)
        assert env[env_name]["valueFrom"]["configMapKeyRef"] == {
            "name": SETTINGS["metadata"]["name"],
            "key": key,
        }
        assert flag not in container["args"]  # the env default decides
        monkeypatch.setenv(env_name, SETTINGS["data"][key])
    assert allowed_by(parse_args(container["args"])) == allowed.SHIPPED
    for _, _, env_name, _ in SETTINGS_READ:  # without the ConfigMap: the same defaults
        monkeypatch.delenv(env_name)
    assert allowed_by(parse_args(["run"])) == allowed.SHIPPED


def test_host_paths_come_from_the_environment(monkeypatch):
    (deployment,) = load("base", "deployment.yaml")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
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


def test_the_probe_fence_names_what_the_code_writes_and_takes_the_probe_accounts():
    text = str(PROBES["spec"])
    filing = reports.report_filing(
        reports.Evidence.inconclusive("r", "http://x", "why")
    )  # what a probe applies
    assert f"['{LABEL_COMPONENT}'] == '{REPORT_COMPONENT}'" in text
    assert f"['{LABEL_INSTANCE}']" in text and f"['{LABEL_MANAGED_BY}'] == '{MANAGED_BY}'" in text
    assert f"'{reports.OUTCOME_KEY}' in oldObject.data" in text  # a filed verdict stands
    assert set(filing) == {"metadata", "data"} and set(filing["metadata"]) == {"annotations"}
    for key in filing["metadata"]["annotations"]:
        assert f"'{key}'" in variable(PROBES, "verdictAnnotations")
    binding = one(FENCE, "ValidatingAdmissionPolicyBinding", "dsv4-probe-fence")
    ref = binding["spec"]["paramRef"]
    assert "namespace" not in ref  # the request's own namespace
    account, role_binding = probe_identity(Owner("flash", "ns", "uid"))
    labels = account["metadata"]["labels"]
    assert ref["selector"]["matchLabels"].items() <= labels.items()
    assert role_binding["roleRef"]["name"] == PROBE_CLUSTER_ROLE


def test_rule_6_pairs_each_shipped_cluster_role_with_the_account_the_code_binds_it_to():
    owner = Owner("flash", "ns", "uid")
    bound = variable(POLICY, "boundAccount")
    for identity in (probe_identity(owner), router_shared(owner)):
        (binding,) = [o for o in identity if o["kind"] == "RoleBinding"]
        (subject,) = binding["subjects"]
        suffix = subject["name"].removeprefix(f"{owner.name}")
        assert f"'{binding['roleRef']['name']}': variables.instance + '{suffix}'" in bound


REPORTS = one(FENCE, "ValidatingAdmissionPolicy", "dsv4-report-fence")
PROBE_ACCOUNTS = one(FENCE, "ValidatingAdmissionPolicy", "dsv4-probe-accounts-fence")
EXEC = one(FENCE, "ValidatingAdmissionPolicy", "dsv4-probe-exec-fence")
ACTIONS = one(FENCE, "ValidatingAdmissionPolicy", "dsv4-rollout-actions")


def test_the_report_fences_name_what_the_code_writes():
    """The report fence finds a report, its deployment and its Job by the labels and the
    annotation the operator writes on the report it creates, and the probe's account by the
    name the operator gives it; the probe-account fences take the accounts and the Jobs the
    operator makes for probes as their params."""
    owner = Owner("flash", "ns", "uid")
    ref = reports.ReportRef("canary", "rev", attempt=1)
    skeleton = reports.report_skeleton(owner, ref)
    created = {**skeleton, "metadata": {**skeleton["metadata"], "uid": "report-uid"}}
    text = str(REPORTS["spec"])
    assert skeleton["metadata"]["labels"][LABEL_COMPONENT] == REPORT_COMPONENT
    assert f"['{LABEL_COMPONENT}'] == '{REPORT_COMPONENT}'" in text
    assert f"'{LABEL_INSTANCE}'" in variable(REPORTS, "instance")
    annotations = skeleton["metadata"]["annotations"]
    assert annotations[reports.ANNOTATION_PROBE_JOB] == ref.job(owner)
    assert f"'{reports.ANNOTATION_PROBE_JOB}'" in variable(REPORTS, "job")
    account, _ = probe_identity(owner)
    assert account["metadata"]["name"] == f"{owner.name}-probe"
    assert "variables.instance + '-probe'" in text
    for policy in ("dsv4-probe-accounts-fence", "dsv4-probe-exec-fence"):
        ref_ = one(FENCE, "ValidatingAdmissionPolicyBinding", policy)["spec"]["paramRef"]
        assert "namespace" not in ref_  # the request's own namespace
        assert ref_["selector"]["matchLabels"].items() <= account["metadata"]["labels"].items()
    job = probe_job(owner, created, "canary", ProbeSettings(base_url="http://x"), "img")
    assert (
        job["metadata"]["labels"].items()
        >= {k: v for k, v in account["metadata"]["labels"].items() if k != LABEL_INSTANCE}.items()
    )
    assert PROBE_ACCOUNTS["spec"]["paramKind"]["kind"] == "ServiceAccount"
    assert EXEC["spec"]["paramKind"]["kind"] == "Job"


def test_each_rollout_action_is_a_verb_of_its_own():
    """Every manual action the operator acts on is a verb the fence asks the authorizer
    for, and a shipped ClusterRole grants exactly that verb."""
    rbac = load("base", "rbac.yaml")
    assert manual.ANNOTATION in str(ACTIONS["spec"]["matchConditions"])
    assert f"<= {manual.MAX_CONTROL}" in ACTIONS["spec"]["validations"][0]["expression"]
    assert manual.BY_ANNOTATION in str(ACTIONS["spec"]["matchConditions"])
    (by,) = [v for v in ACTIONS["spec"]["validations"] if manual.BY_ANNOTATION in v["expression"]]
    assert "== request.userInfo.username" in by["expression"]
    for action in ManualAction:
        assert f"'{action.value}'" in ACTIONS["spec"]["validations"][1]["expression"]
        role = one(rbac, "ClusterRole", f"dsv4-rollout-{action.value}")
        (rule,) = role["rules"]
        assert rule == {
            "apiGroups": ["inference.dsv4.dev"],
            "resources": ["dsv4deployments"],
            "verbs": [action.value],
        }
