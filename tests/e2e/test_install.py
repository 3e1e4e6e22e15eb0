"""Installing from manifests/ on the real local cluster, as a platform team would.

Each kustomize overlay renders, and the API server accepts every rendered object in a
server-side dry run (with stand-ins for the Prometheus Operator CRDs).  Then `base` is
installed for real and the operator runs with nothing but its ServiceAccount's token: it
must reconcile a sample to Ready without a single RBAC denial (the audit log records every
request with the user who made it and the status it got).  The admission fence lets that
token write everything the operator renders for every shipped sample, and nothing outside
the namespaces labelled as served (a privileged host-root pod in kube-system).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import config

from dsv4_dev.cluster.local import LocalCluster
from dsv4_engine.probe import ProbeSettings
from dsv4_operator.kube.cache import Cache
from dsv4_operator.kube.client import Kube
from dsv4_operator.reconcile import watches
from dsv4_operator.render.meta import LABEL_COMPONENT, REPORT_COMPONENT, Owner
from dsv4_operator.rollout.job_executor import JobProbeExecutor
from dsv4_operator.rollout.probe_job import PROBE_CLUSTER_ROLE, probe_account
from dsv4_operator.rollout.reports import ReportRef
from tests.e2e.escapes import (
    FENCE,
    SERVED,
    SERVED_ONLY,
    refused,
    refuses_the_hand_off,
    root_on_the_host,
)
from tests.e2e.helpers import (
    MANIFESTS,
    OPERATOR_NS,
    OPERATOR_POD,
    OPERATOR_SA,
    as_account,
    as_list,
    get_json,
    installed_operator,
    kustomize,
    model_claim,
    responses,
    wait_for,
)
from tests.unit.install import rbac_from_code
from tests.unit.operator.harness import MODEL_HOST_PATHS

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = ("base", "namespaced", "monitoring", "samples")
MONITORING_CRDS = ROOT / "tests" / "data" / "monitoring-crds.yaml"
SAMPLE_NS = "dsv4-install-e2e"
SAMPLES = sorted(
    p for p in (MANIFESTS / "samples").glob("*.yaml") if p.name != "kustomization.yaml"
)


def render(cluster: LocalCluster, overlay: str) -> list[dict[str, Any]]:
    return kustomize(cluster, MANIFESTS / overlay)


def dry_run(cluster: LocalCluster, objects: list[dict[str, Any]], *args: str) -> str:
    result = cluster.kubectl(
        "apply", "--dry-run=server", *args, "-f", "-", input=as_list(objects), check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def flash(cluster: LocalCluster) -> dict[str, Any]:
    """The shipped flash sample (its model on a PVC)."""
    return next(o for o in render(cluster, "samples") if o["metadata"]["name"] == "flash")


def establish(cluster: LocalCluster, *crds: str) -> None:
    for crd in crds:
        cluster.wait_established(f"crd/{crd}")


@pytest.fixture(scope="module")
def prepared(cluster: LocalCluster) -> LocalCluster:
    """The cluster before a dry-run install: the namespaces and CRDs the dry run of the
    namespaced objects needs (a dry run creates nothing, so it cannot provide them)."""
    installs = render(cluster, "base") + render(cluster, "namespaced")
    firsts = [o for o in installs if o["kind"] in ("Namespace", "CustomResourceDefinition")]
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=as_list(firsts))
    cluster.kubectl("apply", "--server-side", "-f", str(MONITORING_CRDS))
    cluster.kubectl("create", "namespace", SAMPLE_NS)
    cluster.kubectl("label", "namespace", SAMPLE_NS, f"{SERVED}=true")
    establish(
        cluster,
        "dsv4deployments.inference.dsv4.dev",
        "servicemonitors.monitoring.coreos.com",
        "podmonitors.monitoring.coreos.com",
        "prometheusrules.monitoring.coreos.com",
    )
    return cluster


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_passes_a_server_side_dry_run(prepared, overlay):
    objects = render(prepared, overlay)
    args = ("-n", SAMPLE_NS) if overlay == "samples" else ()
    out = dry_run(prepared, objects, *args)
    # kubectl names every object it sent; none may be missing from the server's answer.
    assert out.count("(server dry run)") == len(objects), out


def test_the_operator_pod_meets_the_restricted_pod_security_standard(prepared):
    """dsv4-system enforces `restricted`: the API server warns about a non-compliant pod
    template in the dry run and would refuse the pod itself."""
    base = render(prepared, "base")
    result = prepared.kubectl(
        "apply", "--dry-run=server", "--server-side", "-f", "-", input=as_list(base)
    )
    assert "PodSecurity" not in result.stderr, result.stderr
    namespace = next(o for o in base if o["kind"] == "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_monitoring_adds_only_prometheus_objects_to_base(prepared):
    kinds = {o["kind"] for o in render(prepared, "monitoring")}
    base = {o["kind"] for o in render(prepared, "base")}
    assert kinds - base == {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def test_a_bad_sample_is_refused_in_the_dry_run(prepared):
    """The dry run is a real check: the API server applies the CRD's rules to samples."""
    bad = flash(prepared)
    bad["spec"]["decode"]["tp"] = 3
    result = prepared.kubectl(
        "apply", "--dry-run=server", "-n", SAMPLE_NS, "-f", "-",
        input=json.dumps(bad), check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "tp must divide" in result.stderr


# -- the operator, installed from base, with its ServiceAccount's token -------------------


@pytest.fixture(scope="module")
def installed(prepared: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    workdir = tmp_path_factory.mktemp("install")
    model_claim(prepared, SAMPLE_NS, flash(prepared)["spec"]["model"]["pvc"]["claimName"])
    try:
        with installed_operator(prepared, MANIFESTS / "base", workdir) as running:
            yield prepared, running.proc, running.log, running.offset, running.kubeconfig
    finally:
        # Give the GPUs of the fake nodes back to the tests that run after this module.
        prepared.kubectl("delete", "namespace", SAMPLE_NS, "--wait=true", "--timeout=120s")


def test_the_operator_reconciles_a_sample_with_only_its_own_rbac(installed):
    cluster, proc, log, offset, _ = installed
    cluster.kubectl("apply", "-n", SAMPLE_NS, "-f", "-", input=json.dumps(flash(cluster)))

    def ready() -> dict[str, Any] | None:
        assert proc.poll() is None, f"operator exited: {log.read_text()[-3000:]}"
        status = get_json(cluster, "dsv4", "flash", "-n", SAMPLE_NS).get("status") or {}
        return status if status.get("phase") == "Ready" else None

    status = wait_for("sample flash Ready under the ServiceAccount's RBAC", ready, timeout=180)
    # The Deployment's own pod was admitted under the namespace's restricted policy (KWOK
    # only pretends to run it; the operator under test is the local process).
    pods = get_json(cluster, "pods", "-n", OPERATOR_NS, "-l", OPERATOR_POD)
    assert len(pods["items"]) == 1
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
    # Probe Jobs will run the image the Deployment runs, read from its pod under its RBAC.
    (image,) = [c["image"] for c in pods["items"][0]["spec"]["containers"]]
    started = [json.loads(line) for line in log.read_text().splitlines() if "probe_image" in line]
    assert [entry["probe_image"] for entry in started] == [image]

    def operator_requests() -> list[dict[str, Any]]:
        return [e for e in responses(cluster, offset) if e["user"]["username"] == OPERATOR_SA]

    # A Lease renewal (update, allowed only on the Lease's own name) every lease/3 seconds.
    wait_for(
        "a Lease renewal by the operator",
        lambda: any(
            (e["verb"], e.get("objectRef", {}).get("resource")) == ("update", "leases")
            for e in operator_requests()
        ),
        timeout=30,
    )
    ours = operator_requests()
    denied = sorted(
        {
            (e["verb"], e.get("objectRef", {}).get("resource", e["requestURI"]))
            for e in ours
            if e.get("responseStatus", {}).get("code") == 403
        }
    )
    assert not denied, f"RBAC denied the operator: {denied}"
    verbs = {(e["verb"], e.get("objectRef", {}).get("resource", "")) for e in ours}
    # Not vacuous: the token did the work (server-side applies of children, the status, the
    # Lease, the watches), and nothing in its log says it was refused.
    for needed in [
        ("patch", "statefulsets"),
        ("patch", "dsv4deployments"),
        ("watch", "dsv4deployments"),
        ("create", "leases"),
        ("update", "leases"),
        ("patch", "rolebindings"),  # binds dsv4-router: only a holder of its rules may
    ]:
        assert needed in verbs, f"{needed} not among the operator's requests: {sorted(verbs)}"
    # Of the resource itself only the status is written (a control is not removed).
    spec_writes = [
        e["requestURI"]
        for e in ours
        if e["verb"] in ("create", "update", "patch", "delete")
        and (ref := e.get("objectRef") or {}).get("resource") == "dsv4deployments"
        and not ref.get("subresource")
    ]
    assert spec_writes == []
    text = log.read_text()
    assert "403" not in text and "Forbidden" not in text, text[-3000:]

    # The static derivation behind the RBAC unit test saw every request actually made.
    derived = {(a.group, a.resource, a.verb) for a in rbac_from_code.needed()}
    made = {
        (
            ref.get("apiGroup", ""),
            "/".join(filter(None, (ref["resource"], ref.get("subresource")))),
            e["verb"],
        )
        for e in ours
        if (ref := e.get("objectRef")) and "resource" in ref
    }
    assert made - derived == set(), "requests the code analysis missed"


def test_the_operators_rbac_lets_it_run_probe_jobs(installed):
    """What Job mode does on a canary's first probe, done with the operator's own token:
    its ClusterRole must allow the probe identity (a RoleBinding of the shipped dsv4-probe,
    which RBAC allows only to a holder of its ConfigMap access), the report and the Job."""
    cluster, *_, kubeconfig = installed
    kube = Kube(config.new_client_from_config(config_file=str(kubeconfig)))
    flash = get_json(cluster, "dsv4", "flash", "-n", SAMPLE_NS)["metadata"]
    owner = Owner(name="flash", namespace=SAMPLE_NS, uid=flash["uid"])
    ref = ReportRef("canary", "rbac", attempt=1)
    report = ref.name(owner)
    settings = ProbeSettings(base_url=f"http://flash--canary-router.{SAMPLE_NS}.svc:8000")
    # The executor reads Jobs from the operator's cache, which a list and a watch fill (the
    # operator's token gets a Job only when its create meets one): fill it with the same list.
    cache = Cache(watches.stores())
    (jobs,) = [w for w in watches.WATCHES if w.kind == "Job"]

    def relist() -> None:
        cache.store("Job").replace(kube.list("Job", SAMPLE_NS, jobs.selector))

    relist()
    executor = JobProbeExecutor(kube, cache, "ghcr.io/dsv4/operator:0.1.0")
    executor.start(owner, ref, settings)  # an ApiError (403) would raise here
    relist()
    assert executor.running(owner, report)
    job = get_json(cluster, "job", report, "-n", SAMPLE_NS)
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == probe_account(owner)
    binding = get_json(cluster, "rolebinding", probe_account(owner), "-n", SAMPLE_NS)
    assert binding["roleRef"]["name"] == PROBE_CLUSTER_ROLE
    assert [s["name"] for s in binding["subjects"]] == [probe_account(owner)]
    result = cluster.kubectl(
        "auth", "can-i", "delete", "jobs", "-n", SAMPLE_NS, f"--as={OPERATOR_SA}", check=False
    )
    assert result.stdout.strip() == "yes"  # stopping a probe the rollout gave up on


def rendered(sample: Path, namespace: str) -> list[dict[str, Any]]:
    """What the operator writes for ``sample``: its children, a canary's, a probe Job's
    (which runs the operator's own image, as the installed operator finds it)."""
    (deployment,) = yaml.safe_load_all(
        (ROOT / "manifests" / "base" / "deployment.yaml").read_text()
    )
    (operator,) = deployment["spec"]["template"]["spec"]["containers"]
    out = subprocess.run(
        [str(Path(sys.executable).with_name("dsv4ctl")), "render", str(sample),
         "--namespace", namespace, "--canary", "indexDtype=fp4", "--probe-job",
         "--probe-image", operator["image"]],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [doc for doc in yaml.safe_load_all(out) if doc]


def test_the_fence_lets_the_operator_write_what_it_renders_for_every_shipped_sample(
    installed, tmp_path
):
    """Every object `dsv4ctl render` shows for each shipped sample, applied with the
    operator's token as the operator applies it (server side, a dry run): the fence refuses
    none of them.  A hostPath model
    passes only once the fence's settings allow its directory, and the same settings are
    what the operator's Deployment reads (tests/unit/install/test_install_fence.py)."""
    cluster, *_, kubeconfig = installed
    namespace = "dsv4-install-samples"
    cluster.kubectl("create", "namespace", namespace)
    cluster.kubectl("label", "namespace", namespace, f"{SERVED}=true")
    settings = ("configmap", "dsv4-operator-settings", "-n", OPERATOR_NS)

    def allow(paths: str) -> None:
        patch = json.dumps({"data": {"allowedModelHostPaths": paths}})
        cluster.kubectl("patch", *settings, "--type", "merge", "-p", patch)

    def dry_run(objects: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
        """Applied, but a probe attempt's report and Job created (never applied over what
        exists: the operator's token has no `patch` on Jobs)."""
        created = [o for o in objects if o["kind"] == "Job" or is_report(o)]
        applied = [o for o in objects if o not in created]
        result = as_account(
            kubeconfig, "apply", "--server-side", "--dry-run=server", "-f", "-",
            input=as_list(applied),
        )  # fmt: skip
        if result.returncode != 0 or not created:
            return result
        return as_account(
            kubeconfig, "create", "--dry-run=server", "-f", "-", input=as_list(created)
        )

    try:
        host_path_samples = []
        for sample in SAMPLES:
            objects = rendered(sample, namespace)
            assert not [o for o in objects if o["kind"] == "Role"]  # it writes no RBAC rules
            result = dry_run(objects)
            if "hostPath" in json.dumps(yaml.safe_load(sample.read_text())["spec"]["model"]):
                assert FENCE in result.stderr and "volume(s) model" in result.stderr
                host_path_samples.append(objects)
            else:
                assert result.returncode == 0, (sample.name, result.stderr)
        assert host_path_samples, "no shipped sample reads its model from a host path"
        allow(",".join(MODEL_HOST_PATHS))

        def admitted() -> bool:
            return all(dry_run(o).returncode == 0 for o in host_path_samples)

        # The API server's view of its params follows the ConfigMap a moment later.
        wait_for("the fence reading the allowed model paths", admitted, timeout=30)
    finally:
        allow("")
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")


def is_report(obj: dict[str, Any]) -> bool:
    labels = obj["metadata"].get("labels") or {}
    return obj["kind"] == "ConfigMap" and labels.get(LABEL_COMPONENT) == REPORT_COMPONENT


def test_the_cluster_wide_token_writes_nothing_outside_the_served_namespaces(installed):
    """The cluster-wide install's escape: a Deployment labelled as the operator's, in
    kube-system, privileged, in the host's PID namespace, with the node's root mounted.
    Its RBAC allows it everywhere; the fence refuses it there (kube-system is not served)
    and in a served namespace too (what it runs), as it refuses any other write there."""
    cluster, *_, kubeconfig = installed
    message = refused(kubeconfig, root_on_the_host("kube-system"))
    assert FENCE in message and SERVED_ONLY in message
    message = refused(kubeconfig, root_on_the_host(SAMPLE_NS))
    assert FENCE in message and "share no host namespace" in message
    labels = {"app.kubernetes.io/managed-by": "dsv4-operator"}
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "labels": labels}}
    for namespace in ("kube-system", "default"):
        message = refused(
            kubeconfig, {**config, "metadata": {**config["metadata"], "namespace": namespace}}
        )
        assert SERVED_ONLY in message


@pytest.mark.parametrize("account", ["flash-router", "flash-probe"])
def test_the_cluster_wide_token_hands_its_rights_to_no_one(installed, account):
    """The reported escalation (docs/install.md, "Security review"): no Role written, no
    Role or foreign ClusterRole bound to an account it runs pods as; no spec written."""
    cluster, *_, kubeconfig = installed
    refuses_the_hand_off(cluster.kubectl, kubeconfig, SAMPLE_NS, account)


@pytest.mark.parametrize(
    "verb, resource",
    [
        ("get", "secrets"),
        ("delete", "nodes"),
        ("create", "pods"),
        ("delete", "dsv4deployments.inference.dsv4.dev"),
        ("update", "clusterroles"),
        ("create", "roles"),
        ("patch", "dsv4deployments.inference.dsv4.dev"),
        ("update", "dsv4deployments.inference.dsv4.dev"),
        ("create", "leases.coordination.k8s.io"),  # in another namespace than its own
    ],
)
def test_the_operator_cannot_do_what_it_does_not_need(installed, verb, resource):
    cluster = installed[0]
    result = cluster.kubectl(
        "auth", "can-i", verb, resource, "-n", SAMPLE_NS, f"--as={OPERATOR_SA}", check=False
    )
    assert result.stdout.strip() == "no", (verb, resource, result.stdout, result.stderr)
