"""The namespaced install on the real local cluster, with the operator's own token.

manifests/namespaced is installed for real and `dsv4-operator` runs with the installed
Deployment's arguments (`--namespace dsv4-serving`) and nothing but its ServiceAccount's
token.  It reconciles the shipped flash sample to Ready with no RBAC denial and no write
to anything cluster-scoped (the audit log records every request, its user and its
status); the engine and router pods the operator renders pass the namespace's Pod
Security level (`restricted`, enforced by the API server's admission); the admission
fence refuses the token writes its RBAC alone would allow (every escape of
tests/e2e/escapes.py, each by its own rule); a deployment whose router account someone else
holds gets no child at all; a hostPath model outside the (empty) allow-list, an image or a
toleration outside theirs, is refused with a condition.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import config

from dsv4_dev.cluster.local import LocalCluster
from dsv4_engine.probe import ProbeSettings
from dsv4_operator.api import GROUP, PLURAL, VERSION
from dsv4_operator.api.allowed import SHIPPED_DEVICES, image_allowed, toleration_text
from dsv4_operator.api.samples import SHIPPED_DIR, merge_patch
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.cli.main import main as dsv4ctl
from dsv4_operator.kube.client import Kube
from dsv4_operator.render import render_all
from dsv4_operator.render.meta import (
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    Owner,
)
from dsv4_operator.rollout.probe_job import (
    PROBE_CLUSTER_ROLE,
    probe_account,
    probe_identity,
    probe_job,
)
from dsv4_operator.rollout.reports import (
    PROBE_MANAGER,
    Evidence,
    ReportRef,
    report_filing,
    report_skeleton,
)
from tests.e2e import escapes
from tests.e2e.escapes import (
    ACCOUNTS_FENCE,
    BINDS_ONLY,
    ESCAPES,
    FENCE,
    PROBE_FENCE,
    REPORT_FENCE,
    refused,
)
from tests.e2e.helpers import (
    MANIFESTS,
    OPERATOR_NS,
    OPERATOR_SA,
    Installed,
    account_kubeconfig,
    as_account,
    as_list,
    get_json,
    installed_operator,
    kustomize,
    model_claim,
    responses,
    wait_for,
)
from tests.unit.operator.test_op_allowed import IMAGE_CASES, IMAGES, TOLERATION_CASES

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
# The toleration list the agreement test gives the fence: some of TOLERATION_CASES' texts.
TOLERATIONS = ("nvidia.com/gpu:NoSchedule", "pool=a:NoSchedule", "pool")

NS = "dsv4-serving"
SAMPLE = SHIPPED_DIR / "flash-b200-1p1d.yaml"
WRITES = ("create", "update", "patch", "delete", "deletecollection")
MANAGED = {LABEL_MANAGED_BY: MANAGED_BY}


@pytest.fixture(scope="module")
def installed(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Installed]:
    workdir = tmp_path_factory.mktemp("namespaced")
    sample = yaml.safe_load(SAMPLE.read_text())
    try:
        with installed_operator(cluster, MANIFESTS / "namespaced", workdir) as running:
            model_claim(cluster, NS, sample["spec"]["model"]["pvc"]["claimName"])
            cluster.kubectl("apply", "-n", NS, "-f", str(SAMPLE))
            yield running
    finally:
        # Frees the fake GPUs, and leaves the cluster-wide install (base) as it was.
        cluster.kubectl("delete", "namespace", NS, "--wait=true", "--timeout=120s")
        base = kustomize(cluster, MANIFESTS / "base")
        cluster.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", "-", input=as_list(base)
        )


def operator_requests(cluster: LocalCluster, running: Installed) -> list[dict[str, Any]]:
    return [e for e in responses(cluster, running.offset) if e["user"]["username"] == OPERATOR_SA]


def test_the_namespaced_operator_reconciles_the_sample_without_403_or_cluster_writes(
    cluster, installed
):
    def ready() -> dict[str, Any] | None:
        assert installed.proc.poll() is None, installed.log.read_text()[-3000:]
        status = get_json(cluster, "dsv4", "flash", "-n", NS).get("status") or {}
        return status if status.get("phase") == "Ready" else None

    try:
        wait_for("the flash sample Ready under the namespaced install", ready, timeout=180)
    except AssertionError as err:
        status = get_json(cluster, "dsv4", "flash", "-n", NS).get("status")
        raise AssertionError(f"{err}\n{status}\n{installed.log.read_text()[-4000:]}") from None
    ours = operator_requests(cluster, installed)
    denied = sorted(
        {
            (e["verb"], e.get("objectRef", {}).get("resource", e["requestURI"]))
            for e in ours
            if e.get("responseStatus", {}).get("code") == 403
        }
    )
    assert not denied, f"RBAC denied the operator: {denied}"
    writes = [e for e in ours if e["verb"] in WRITES]
    cluster_scoped = [e["requestURI"] for e in writes if not e["objectRef"].get("namespace")]
    assert cluster_scoped == []
    assert {e["objectRef"]["namespace"] for e in writes} == {NS, "dsv4-system"}  # + Lease
    assert {e["objectRef"]["resource"] for e in writes} >= {"statefulsets", "networkpolicies"}
    # Its ClusterRole is only the cluster-scoped read manifests/namespaced argues for.
    role = get_json(cluster, "clusterrole", "dsv4-operator")
    nodes = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}
    assert role["rules"] == [nodes]  # the node cache: a list, then a watch
    for namespace, verb, resource, *sub in [
        ("kube-system", "create", "configmaps"),
        ("kube-system", "list", "pods"),
        ("kube-system", "patch", "statefulsets"),
        # Not even where it works (docs/install.md, "Security review").
        (NS, "get", "secrets"),
        (NS, "create", "pods"),
        (NS, "create", "pods", "--subresource=exec"),
        (NS, "create", "serviceaccounts", "--subresource=token"),
    ]:
        allowed = cluster.kubectl(
            "auth", "can-i", verb, resource, *sub, "-n", namespace, f"--as={OPERATOR_SA}",
            check=False,
        )  # fmt: skip
        assert allowed.stdout.strip() == "no", (namespace, verb, resource, sub)


def pod_of(workload: dict[str, Any]) -> dict[str, Any]:
    template = workload["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "psa-check-", "labels": template["metadata"]["labels"]},
        "spec": template["spec"],
    }


def create_dry_run(cluster: LocalCluster, pod: dict[str, Any]):
    return cluster.kubectl(
        "create", "--dry-run=server", "-n", NS, "-f", "-", input=json.dumps(pod), check=False
    )


def test_rendered_pods_pass_the_namespaces_pod_security_level(cluster, installed, capsys):
    """Every pod `dsv4ctl render` shows (engines, routers, the canary's, a probe Job's) is
    admitted by the API server's Pod Security admission of the `restricted` namespace."""
    namespace = get_json(cluster, "namespace", NS)["metadata"]["labels"]
    assert namespace["pod-security.kubernetes.io/enforce"] == "restricted"
    assert dsv4ctl(["render", str(SAMPLE), "--canary", "indexDtype=fp4", "--probe-job"]) == 0
    rendered = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    workloads = [o for o in rendered if o["kind"] in ("StatefulSet", "Deployment", "Job")]
    components = {w["metadata"]["labels"]["app.kubernetes.io/component"] for w in workloads}
    assert components == {"prefill", "decode", "router", "probe"}
    for account in (o for o in rendered if o["kind"] == "ServiceAccount"):
        # A pod is admitted only under an existing account: the canary's and the probe's.
        meta = {"name": account["metadata"]["name"], "namespace": NS}
        cluster.kubectl("apply", "-f", "-", input=json.dumps({**account, "metadata": meta}))
    for workload in workloads:
        result = create_dry_run(cluster, pod_of(workload))
        assert result.returncode == 0, (workload["metadata"]["name"], result.stderr)
        assert "PodSecurity" not in result.stderr, result.stderr
    # The pods the controllers created for the sample were admitted the same way.
    wait_for(
        "the sample's engine and router pods",
        lambda: len(get_json(cluster, "pods", "-n", NS)["items"]) >= 3,
        timeout=60,
    )


def test_the_namespace_enforces_its_level_a_host_path_model_is_refused(cluster, installed):
    """The check above can fail: a hostPath model (beyond `restricted`, and `baseline`) is
    refused by the same admission, so such a deployment needs a privileged namespace."""
    spec = yaml.safe_load(SAMPLE.read_text())["spec"]
    spec = merge_patch(spec, {"model": {"pvc": None, "hostPath": "/data/models/flash"}})
    owner = Owner(name="flash", namespace=NS, uid="00000000-0000-0000-0000-000000000000")
    objects = render_all(owner, DSV4DeploymentSpec.model_validate(spec))
    engine = next(o for o in objects if o["kind"] == "StatefulSet")
    result = create_dry_run(cluster, pod_of(engine))
    assert result.returncode != 0
    assert "violates PodSecurity" in result.stderr and "hostPath" in result.stderr


def configmap(name: str, labels: dict[str, str]) -> str:
    meta = {"name": name, "namespace": NS, "labels": labels}
    return json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta})


def test_the_admission_fence_refuses_the_operators_token_outside_it(cluster, installed):
    token = installed.kubeconfig

    # RBAC lets the token create ConfigMaps here: the fence still wants its label.
    assert FENCE in refused(token, json.loads(configmap("stranger", {})))
    allowed = as_account(token, "create", "-f", "-", input=configmap("ours", MANAGED))
    assert allowed.returncode == 0, allowed.stderr  # the fence is not a wall
    # Someone else's object: not changed, not relabelled into the fence, not deleted.
    cluster.kubectl("create", "configmap", "theirs", "-n", NS)
    for args in (
        ("label", "configmap", "theirs", "-n", NS, "a=b"),
        ("label", "configmap", "theirs", "-n", NS, f"{LABEL_MANAGED_BY}={MANAGED_BY}"),
        ("delete", "configmap", "theirs", "-n", NS),
    ):
        result = as_account(token, *args)
        assert result.returncode != 0 and FENCE in result.stderr, (args, result.stderr)
    # Pod templates: not under a ServiceAccount it did not make, nor with the default's token.
    cluster.kubectl("create", "serviceaccount", "builder", "-n", NS)
    mounted = escapes.workload(NS)  # the default account, its token mounted
    del mounted["spec"]["template"]["spec"]["automountServiceAccountToken"]
    # Both policies refuse `builder` (not the instance's account; not labelled as the
    # operator's): the API server names the one it happened to evaluate first.
    message = refused(token, escapes.workload(NS, pod={"serviceAccountName": "builder"}))
    assert FENCE in message or ACCOUNTS_FENCE in message, message
    for escape in (
        escapes.workload(
            NS, pod={"serviceAccountName": "default", "automountServiceAccountToken": True}
        ),
        mounted,
    ):
        assert FENCE in refused(token, escape)
    own = escapes.workload(NS, "own", pod={"serviceAccountName": "flash-router"})
    ok = as_account(token, "create", "-f", "-", input=json.dumps(own))
    assert ok.returncode == 0, ok.stderr
    # RoleBindings: a shipped ClusterRole to its own kind of account of the instance, one
    # the operator made (`builder` is neither: either policy may be the one named).
    router = {"kind": "ClusterRole", "name": "dsv4-router"}
    message = refused(token, escapes.role_binding(NS, "b1", router, "builder"))
    assert BINDS_ONLY in message or ACCOUNTS_FENCE in message, message
    good = escapes.role_binding(NS, "b2", router, "flash-router")
    created = as_account(token, "create", "-f", "-", input=json.dumps(good))
    assert created.returncode == 0, created.stderr


@pytest.mark.parametrize("escape", sorted(ESCAPES))
def test_the_fence_refuses_each_escape_with_the_operators_token(installed, escape):
    """What a workload, Service, NetworkPolicy or PDB of the operator may not be, each
    refused by its own rule (docs/install.md, "Security review")."""
    build, why = ESCAPES[escape]
    message = refused(installed.kubeconfig, build(NS))
    assert FENCE in message and why in message, message


def test_an_allowed_model_directory_is_mounted_read_only_as_a_directory_in_its_namespace(
    cluster, installed
):
    """The review's read-write hostPath of `type: Socket`, under a directory the settings
    allow: refused by rule 7 whatever rule 4 allows.  And the review's cross-tenant mount:
    the directory scoped to another namespace is refused here."""
    settings = ("configmap", "dsv4-operator-settings", "-n", OPERATOR_NS)
    shipped = get_json(cluster, *settings)["data"]
    allow = {"data": {"allowedModelHostPaths": f"{NS}={escapes.MODEL_HOST_PATH}"}}
    elsewhere = {"data": {"allowedModelHostPaths": f"tenant-a={escapes.MODEL_HOST_PATH}"}}
    mounted = {"name": "model", "hostPath": {"path": escapes.MODEL_HOST_PATH, "type": "Directory"}}
    read_only = escapes.workload(
        NS,
        pod={"volumes": [mounted]},
        container={"volumeMounts": [{"name": "model", "mountPath": "/m", "readOnly": True}]},
    )

    def admitted() -> bool:
        result = as_account(
            installed.kubeconfig, "create", "--dry-run=server", "-f", "-",
            input=json.dumps(read_only),
        )  # fmt: skip
        return result.returncode == 0

    try:
        cluster.kubectl("patch", *settings, "--type", "merge", "-p", json.dumps(allow))
        wait_for("the fence reading the allowed directory", admitted, timeout=30)
        for build, why in escapes.HOST_PATH_ESCAPES.values():
            message = refused(installed.kubeconfig, build(NS))
            assert FENCE in message and why in message, message
        cluster.kubectl("patch", *settings, "--type", "merge", "-p", json.dumps(elsewhere))
        wait_for("the fence reading tenant-a's directory", lambda: not admitted(), timeout=30)
        message = refused(installed.kubeconfig, read_only)
        assert FENCE in message and "volume(s) model may not be mounted" in message, message
    finally:
        cluster.kubectl("patch", *settings, "--type", "merge", "-p", json.dumps({"data": shipped}))


def test_a_router_never_runs_as_a_service_account_someone_else_made(cluster, installed):
    """The reported hijack: the namespace has a ServiceAccount `ci-router` the operator did
    not make, and a tenant creates a DSV4Deployment `ci` with a router image of its own.
    The operator writes none of `ci`'s children (no router Deployment running as
    `ci-router`, no engines without their NetworkPolicy) and says which object blocks it;
    the fence would refuse the router's template anyway, by the account's label, not its
    name."""
    cluster.kubectl("create", "serviceaccount", "ci-router", "-n", NS)
    # An image the allow-list admits (one outside it is refused on its own, below).
    ci = merge_patch(
        yaml.safe_load(SAMPLE.read_text()),
        {"metadata": {"name": "ci"}, "spec": {"router": {"image": "ghcr.io/dsv4/router:any"}}},
    )
    cluster.kubectl("apply", "-n", NS, "-f", "-", input=json.dumps(ci))

    def conflict() -> dict[str, Any] | None:
        status = get_json(cluster, "dsv4", "ci", "-n", NS).get("status") or {}
        found = [c for c in status.get("conditions", []) if c["reason"] == "NameConflict"]
        return found[0] if found else None

    condition = wait_for("ci stopped on the name conflict", conflict, timeout=60)
    assert "ServiceAccount ci-router (held by no owner)" in condition["message"]
    children = get_json(
        cluster, "all,sa,netpol,pdb,cm,rolebinding", "-n", NS, "-l", "app.kubernetes.io/instance=ci"
    )
    assert children["items"] == []

    def warned() -> bool:
        # A pass writes the status first, then its Events: the Warning follows the condition.
        events = get_json(cluster, "events", "-n", NS, "--field-selector", "reason=NameConflict")
        return any("ci-router" in e["message"] for e in events["items"])

    wait_for("a NameConflict Warning naming ci-router", warned, 30)
    # Written with the operator's token, the router's template is refused by the account's
    # missing label, although it is named as the operator names its routers.
    router = escapes.workload(
        NS,
        "ci-router",
        pod={"serviceAccountName": "ci-router", "automountServiceAccountToken": True},
        instance="ci",
    )
    message = refused(installed.kubeconfig, router)
    assert ACCOUNTS_FENCE in message
    assert "run as ServiceAccount ci-router, which the operator did not create" in message
    # The name freed, the operator makes the account its own, then what runs as it.
    cluster.kubectl("delete", "serviceaccount", "ci-router", "-n", NS)

    def written() -> dict[str, Any] | None:
        found = cluster.kubectl(
            "get", "deployment", "ci-router", "-n", NS, "-o", "json", check=False
        )
        return json.loads(found.stdout) if found.returncode == 0 else None

    deployment = wait_for("ci's router written", written, timeout=60)
    account = get_json(cluster, "serviceaccount", "ci-router", "-n", NS)
    assert account["metadata"]["labels"][LABEL_MANAGED_BY] == MANAGED_BY
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "ci-router"
    cluster.kubectl("delete", "dsv4", "ci", "-n", NS, "--wait=true", "--timeout=60s")


def test_a_host_path_outside_the_allow_list_is_refused_with_a_condition(cluster, installed):
    """The installed Deployment allows no hostPath prefix at all."""
    sample = merge_patch(
        yaml.safe_load(SAMPLE.read_text()),
        {"metadata": {"name": "hostpath"}, "spec": {"model": {"pvc": None, "hostPath": "/etc"}}},
    )
    cluster.kubectl("apply", "-n", NS, "-f", "-", input=json.dumps(sample))

    def degraded() -> dict[str, Any] | None:
        status = get_json(cluster, "dsv4", "hostpath", "-n", NS).get("status") or {}
        return status if status.get("phase") == "Degraded" else None

    status = wait_for("hostpath Degraded", degraded, timeout=60)
    condition = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert condition["reason"] == "HostPathNotAllowed"
    assert "spec.model.hostPath: /etc is not under" in condition["message"]
    children = get_json(cluster, "all", "-n", NS, "-l", "app.kubernetes.io/instance=hostpath")
    assert children["items"] == []


@pytest.mark.parametrize(
    ("name", "patch", "reason", "why"),
    [
        (
            "router-image",
            {"router": {"image": "attacker.example/r:1"}},
            "ImageNotAllowed",
            "spec.router.image: attacker.example/r:1 is not an image the operator allows "
            "(allowedImages in ConfigMap dsv4-system/dsv4-operator-settings: ghcr.io/dsv4)",
        ),
        (
            "every-taint",
            {"placement": {"tolerations": [{"operator": "Exists"}]}},
            "TolerationNotAllowed",
            "spec.placement.tolerations[0]: the toleration * is not one the operator allows "
            "(allowedTolerations in ConfigMap dsv4-system/dsv4-operator-settings: "
            "nvidia.com/gpu:NoSchedule)",
        ),
        (
            "kvm-device",
            {"decode": {"resources": {"rdma": {"resourceName": "devices.kubevirt.io/kvm"}}}},
            "DeviceNotAllowed",
            "spec.decode.resources.rdma.resourceName: devices.kubevirt.io/kvm is not a device "
            "resource the operator allows (allowedDeviceResources in ConfigMap "
            f"dsv4-system/dsv4-operator-settings: {SHIPPED_DEVICES.replace(',', ', ')})",
        ),
    ],
    ids=["image", "toleration", "device"],
)
def test_an_image_or_toleration_outside_the_allow_lists_is_refused_with_a_condition(
    cluster, installed, name, patch, reason, why
):
    """The tenant's exploits: a router image of its own (it would run with the router's
    token), a toleration of every taint (a GPU pool partitioned by its taint) and a device
    of its choosing for the engines' "RDMA" (KVM, with the IPC_LOCK the operator adds).  The
    installed operator, reading the shipped settings, writes no child and says why; the
    fence would refuse the pod templates anyway (`escapes.py`, `*-outside-the-allow-list`)."""
    sample = merge_patch(
        yaml.safe_load(SAMPLE.read_text()), {"metadata": {"name": name}, "spec": patch}
    )
    cluster.kubectl("apply", "-n", NS, "-f", "-", input=json.dumps(sample))

    def degraded() -> dict[str, Any] | None:
        status = get_json(cluster, "dsv4", name, "-n", NS).get("status") or {}
        return status if status.get("phase") == "Degraded" else None

    status = wait_for(f"{name} Degraded", degraded, timeout=60)
    condition = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert condition["reason"] == reason
    assert condition["message"].startswith(why), condition["message"]
    children = get_json(
        cluster, "all,sa,netpol,pdb,cm,rolebinding", "-n", NS, "-l", f"{LABEL_INSTANCE}={name}"
    )
    assert children["items"] == []
    cluster.kubectl("delete", "dsv4", name, "-n", NS, "--wait=true", "--timeout=60s")


def test_the_fence_and_the_operator_judge_images_and_tolerations_alike(cluster, installed):
    """The same cases as the operator's unit tests (test_op_allowed.py), given to the fence
    with the operator's token once the settings hold the same lists: every verdict agrees."""
    settings = ("configmap", "dsv4-operator-settings", "-n", OPERATOR_NS)
    shipped = get_json(cluster, *settings)["data"]
    lists = {"allowedImages": ",".join(IMAGES), "allowedTolerations": ",".join(TOLERATIONS)}

    def admitted(workload: dict[str, Any]) -> bool:
        result = as_account(
            installed.kubeconfig, "create", "--dry-run=server", "-f", "-",
            input=json.dumps(workload),
        )  # fmt: skip
        assert result.returncode == 0 or FENCE in result.stderr, result.stderr
        return result.returncode == 0

    cases = [
        (image, escapes.workload(NS, container={"image": image}), image_allowed(image, IMAGES))
        for image, _ in IMAGE_CASES
    ] + [
        (
            text,
            escapes.workload(NS, pod={"tolerations": [toleration]}),
            toleration_text(toleration) in TOLERATIONS,
        )
        for toleration, text in TOLERATION_CASES
    ]
    assert {verdict for *_, verdict in cases} == {True, False}
    try:
        cluster.kubectl("patch", *settings, "--type", "merge", "-p", json.dumps({"data": lists}))
        # The API server's view of its params follows the ConfigMap a moment later.
        wait_for(
            "the fence reading the test's lists",
            lambda: admitted(escapes.workload(NS, container={"image": "lmsysorg/sglang:x"})),
            timeout=30,
        )
        disagree = [(what, ours) for what, workload, ours in cases if admitted(workload) != ours]
        assert disagree == [], disagree
    finally:
        cluster.kubectl("patch", *settings, "--type", "merge", "-p", json.dumps({"data": shipped}))


def test_the_operators_token_reads_whether_its_crd_is_served(installed):
    """Before kopf starts, the namespaced operator asks the API's discovery whether its CRD
    is served (runtime.crd_served): its token may, with no cluster-wide read of CRDs, and
    the answer tells a served resource from a missing one and from a missing group."""
    operator = Kube(config.new_client_from_config(config_file=str(installed.kubeconfig)))
    assert operator.serves(GROUP, VERSION, PLURAL)
    assert not operator.serves(GROUP, VERSION, "dsv4widgets")
    assert not operator.serves(f"absent.{GROUP}", VERSION, PLURAL)


def test_a_probe_fills_in_only_an_unfiled_report_of_its_own_deployment(
    cluster, installed, tmp_path
):
    """dsv4-probe lets a probe account patch the ConfigMaps of its namespace (RBAC cannot
    name a report before it exists); the probe fence narrows that back to what `dsv4ctl
    probe` files: the verdict of a report of its own deployment that holds none yet, and the
    report fence to a write from a pod of the Job the report names, with the token the API
    server bound to that pod.  The operator's token makes the probe identity, the reports
    and the Job, as in Job mode; the Job controller makes its pod (KWOK completes it)."""
    operator = Kube(config.new_client_from_config(config_file=str(installed.kubeconfig)))
    uid = get_json(cluster, "dsv4", "flash", "-n", NS)["metadata"]["uid"]
    flash, other = Owner("flash", NS, uid), Owner("other", NS, uid)
    # An account of that name someone else made (the admin; the Pod Security test's too):
    # the operator may not bind it.  Once that one is gone, it makes its own and binds it.
    account = {"apiVersion": "v1", "kind": "ServiceAccount"}
    account["metadata"] = {"name": probe_account(flash), "namespace": NS}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(account))
    ref = {"kind": "ClusterRole", "name": PROBE_CLUSTER_ROLE}
    unmade = escapes.role_binding(NS, probe_account(flash), ref, probe_account(flash))
    message = refused(installed.kubeconfig, unmade)
    assert ACCOUNTS_FENCE in message and "it would bind ServiceAccount flash-probe" in message
    cluster.kubectl("delete", "serviceaccount", probe_account(flash), "-n", NS)
    for obj in probe_identity(flash):
        operator.apply(obj)
    attempt = ReportRef("canary", "fence", attempt=1)
    own = operator.create(report_skeleton(flash, attempt))
    theirs = report_skeleton(other, attempt)
    del theirs["metadata"]["ownerReferences"]  # no DSV4Deployment `other`: the GC's otherwise
    operator.create(theirs)
    deployment = next(o for o in installed.objects if o["kind"] == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    settings = ProbeSettings(base_url=f"http://flash--canary-router.{NS}.svc:8000")
    job = operator.create(probe_job(flash, own, "canary", settings, container["image"]))
    (pod,) = wait_for(
        "the probe Job's pod",
        lambda: get_json(cluster, "pods", "-n", NS, "-l", f"job-name={job['metadata']['name']}")[
            "items"
        ],
        60,
    )
    # A ConfigMap of the namespace that is no report: a tenant's own (one labelled as
    # flash's would be pruned by the running operator under the probe's hands, and flash's
    # engine ConfigMaps are immutable, refused before admission).
    engine = {"apiVersion": "v1", "kind": "ConfigMap"}
    engine["metadata"] = {"name": "tenant-settings", "namespace": NS}
    cluster.kubectl("apply", "-f", "-", input=json.dumps({**engine, "data": {"k": "v"}}))
    bound = (pod["metadata"]["name"], pod["metadata"]["uid"])
    probe = account_kubeconfig(cluster, NS, probe_account(flash), tmp_path / "probe.yaml", bound)
    unbound = account_kubeconfig(cluster, NS, probe_account(flash), tmp_path / "unbound.yaml")

    def file(
        target: dict[str, Any], labels: dict[str, str] | None = None, kubeconfig: Path = probe
    ):
        """What the probe applies, as its field manager, into ``target``."""
        name = target["metadata"]["name"]
        filing = report_filing(Evidence.inconclusive(name, "http://x", "the fence test"))
        filing["metadata"].update(name=name, namespace=NS, labels=labels or {})
        body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", **filing})
        return as_account(
            kubeconfig, "apply", "--server-side", "--force-conflicts",
            f"--field-manager={PROBE_MANAGER}", "-f", "-", input=body,
        )  # fmt: skip

    # Both fences refuse another deployment's report; the API server names the first.
    theirs_refused = {
        REPORT_FENCE: "it is a rollout report of DSV4Deployment other",
        PROBE_FENCE: "is not a rollout report of DSV4Deployment flash",
    }
    for target, labels, refusals in (
        (theirs, None, theirs_refused),
        (engine, None, {PROBE_FENCE: "is not a rollout report of DSV4Deployment flash"}),
        (own, {LABEL_INSTANCE: "other"}, {PROBE_FENCE: "a probe writes only the report's data"}),
    ):
        result = file(target, labels)
        assert result.returncode != 0, (target["metadata"]["name"], result.stdout)
        assert any(f in result.stderr and w in result.stderr for f, w in refusals.items()), (
            result.stderr
        )
    # The probe account's own token, not bound to a pod of the report's Job: refused.
    result = file(own, kubeconfig=unbound)
    assert result.returncode != 0 and REPORT_FENCE in result.stderr, result.stderr
    assert f"by a pod of its probe Job {job['metadata']['name']}" in result.stderr
    filed = file(own)
    assert filed.returncode == 0, filed.stderr
    again = file(own)
    assert again.returncode != 0 and "a filed verdict stands" in again.stderr, again.stderr
    # Nothing created or deleted (RBAC: dsv4-probe has neither verb).
    for args in (
        ("delete", "configmap", own["metadata"]["name"]),
        ("create", "configmap", "probe-made"),
    ):
        result = as_account(probe, *args, "-n", NS)
        assert result.returncode != 0 and "forbidden" in result.stderr.lower(), result.stderr


@pytest.mark.parametrize("account", ["flash-router", "flash-probe"])
def test_the_operator_hands_its_rights_to_no_one(cluster, installed, account):
    """The reported escalation (docs/install.md, "Security review"): no Role written, no
    Role or foreign ClusterRole bound to an account it runs pods as; no spec written.  (Last
    in the module: both accounts are the operator's by now.)"""
    escapes.refuses_the_hand_off(cluster.kubectl, installed.kubeconfig, NS, account)
