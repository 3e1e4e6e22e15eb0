"""Probe Jobs on a real control plane.

The Job a rollout creates runs `dsv4ctl probe` as the probe's own ServiceAccount: first the
test creates the Job, plays its pod and runs the Job's exact arguments under the token the
API server binds to that pod, so the
command line, the report filing and the shipped dsv4-probe ClusterRole, bound, are all
checked by the real API server.  A Job whose pod nothing runs (no local runtime: KWOK completes a Job's pod
with exit code 0, having run nothing) ends without a verdict: INCONCLUSIVE, never re-run.
Then an operator on the local cluster's defaults (Job mode) takes a fault-injected flag
change through a canary: the local runtime runs the probe Job's pod, the probe files FAIL
and exits 1, the Job controller fails the Job by its podFailurePolicy, and the flags are
rolled back — while every other Job's pod is still completed by KWOK.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from kubernetes import config
from prometheus_client.parser import text_string_to_metric_families

from dsv4_dev.cluster.local import LocalCluster
from dsv4_dev.operator import LOCAL_PROBE_IMAGE, install_shipped_cluster_roles
from dsv4_engine.probe import ProbeSettings
from dsv4_operator.api.crd import CRD_PATH
from dsv4_operator.api.rollout import RolloutVerdict
from dsv4_operator.api.samples import shipped_sample
from dsv4_operator.kube.client import Kube
from dsv4_operator.render.meta import LABEL_COMPONENT, Owner
from dsv4_operator.rollout.executor import create_report
from dsv4_operator.rollout.job_executor import JobProbeExecutor
from dsv4_operator.rollout.probe_job import (
    ANNOTATION_REPORT,
    COMPONENT,
    JobState,
    job_state,
    probe_account,
    probe_identity,
    probe_job,
)
from dsv4_operator.rollout.reports import (
    PROBE_MANAGER,
    REPORT_KEY,
    ReportRef,
    outcome_from_config_map,
)
from dsv4_operator.runtime import probe_image
from tests.e2e.helpers import (
    Background,
    account_kubeconfig,
    get_json,
    operator_and_runtime,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

IMAGE = "ghcr.io/dsv4/operator:e2e"
VERDICT_TIMEOUT = 900  # spec.canary.probeTimeoutSeconds, the default
BIN = Path(sys.executable).parent


def create_deployment(cluster: LocalCluster, namespace: str) -> Owner:
    """The shipped reference-engine sample, unchanged, in ``namespace``."""
    cluster.kubectl("apply", "--server-side", "-f", str(CRD_PATH))
    cluster.wait_established("crd/dsv4deployments.inference.dsv4.dev")
    cluster.kubectl("create", "namespace", namespace, check=False)
    sample = shipped_sample("flash-reference")
    sample["metadata"]["namespace"] = namespace
    cluster.kubectl("apply", "-f", "-", input=json.dumps(sample))
    uid = get_json(cluster, "dsv4", "flash", "-n", namespace)["metadata"]["uid"]
    return Owner(name="flash", namespace=namespace, uid=uid)


def admin(cluster: LocalCluster) -> Kube:
    return Kube(config.new_client_from_config(config_file=cluster.kubeconfig))


# -- the Job's command, run as the probe's own ServiceAccount --------------------------------
COMMAND_NS = "probe-job-command"


PERMITTED = ReportRef("canary", "perm", attempt=1)


def file_skeleton(kube: Kube, owner: Owner, ref: ReportRef) -> dict:
    """What the operator does before a probe Job: the report, then the Job's identity."""
    skeleton = create_report(kube, owner, ref)
    assert skeleton is not None
    for obj in probe_identity(owner):
        kube.apply(obj)
    return skeleton


@pytest.fixture(scope="module")
def owner(cluster: LocalCluster) -> Owner:
    """A DSV4Deployment to own the reports; no operator watches this namespace (the
    ClusterRoles the install ships are applied, as the operator's launcher does)."""
    install_shipped_cluster_roles(config.new_client_from_config(config_file=cluster.kubeconfig))
    owner = create_deployment(cluster, COMMAND_NS)
    file_skeleton(admin(cluster), owner, PERMITTED)
    return owner


@pytest.mark.parametrize(
    ("server", "exit_code", "verdict"),
    [
        ({"corruption_rate": 0.0}, 0, RolloutVerdict.PASS),
        ({"corruption_rate": 0.3, "seed": 5}, 1, RolloutVerdict.FAIL),
        (None, 2, RolloutVerdict.INCONCLUSIVE),  # nothing listens: no evidence
    ],
    ids=["pass", "fail", "unreachable"],
)
def test_the_jobs_command_files_its_verdict_as_the_probe_account(
    cluster, owner, server_thread, tmp_path, server, exit_code, verdict
):
    kube = admin(cluster)
    ref = ReportRef("canary", f"cmd{exit_code}", attempt=1)
    report = ref.name(owner)
    skeleton = file_skeleton(kube, owner, ref)
    url = server_thread(**server).url if server is not None else "http://127.0.0.1:9"
    # The warm-up waits only for an engine that does not answer: how long it waits by
    # default is the unit tests' (test_probe_runner); here, what the Job files after it.
    settings = ProbeSettings(
        base_url=url,
        backend="reference",
        concurrency=8,
        requests=60,
        max_corruption_rate=0.1,
        warm_up_s=2.0,
    )
    # The Job as the operator creates it; the Job controller makes its pod (KWOK completes
    # it, running nothing), and the test plays that pod: the Job's arguments, with the token
    # the API server binds to the pod (as kubelet mounts it), which the report fence asks.
    job = kube.create(probe_job(owner, skeleton, "canary", settings, IMAGE))
    (container,) = job["spec"]["template"]["spec"]["containers"]
    (pod,) = wait_for(
        "the Job's pod",
        lambda: get_json(
            cluster, "pods", "-n", COMMAND_NS, "-l", f"job-name={job['metadata']['name']}"
        )["items"],
        60,
    )
    kubeconfig = account_kubeconfig(
        cluster, owner.namespace, probe_account(owner), tmp_path / "probe.kubeconfig",
        (pod["metadata"]["name"], pod["metadata"]["uid"]),
    )  # fmt: skip

    ran = subprocess.run(
        [str(BIN / container["command"][0]), *container["args"], "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=180,
    )

    assert ran.returncode == exit_code, ran.stderr
    filed = kube.get("ConfigMap", COMMAND_NS, report)
    outcome = outcome_from_config_map(filed)
    assert outcome is not None and outcome.verdict is verdict
    assert json.loads(filed["data"][REPORT_KEY])["verdict"] == verdict.value
    # The probe wrote only the verdict: what the operator set (owner, labels) is intact.
    assert filed["metadata"]["ownerReferences"] == skeleton["metadata"]["ownerReferences"]
    assert filed["metadata"]["labels"] == skeleton["metadata"]["labels"]
    managers = {m["manager"] for m in filed["metadata"]["managedFields"]}
    assert managers == {"dsv4-operator", "dsv4-probe"}


@pytest.mark.parametrize(
    ("verb", "resource", "namespace", "allowed"),
    [
        ("patch", "configmaps/flash-canary-perm-1", COMMAND_NS, True),
        ("get", "configmaps/flash-canary-perm-1", COMMAND_NS, True),
        # Which ConfigMaps, and which of their fields, the probe fence decides (a report
        # of its own deployment, unfiled; test_namespaced_install.py shows it refusing).
        ("patch", "configmaps/flash-engine", COMMAND_NS, True),
        ("create", "configmaps", COMMAND_NS, False),  # the operator creates the report
        ("delete", "configmaps/flash-canary-perm-1", COMMAND_NS, False),
        ("patch", "configmaps/flash-canary-perm-1", "default", False),  # its namespace only
        ("get", "secrets", COMMAND_NS, False),
        ("patch", "dsv4deployments", COMMAND_NS, False),
    ],
)
def test_the_probe_account_may_read_and_patch_configmaps_of_its_namespace_only(
    cluster, owner, verb, resource, namespace, allowed
):
    user = f"system:serviceaccount:{COMMAND_NS}:{probe_account(owner)}"
    answer = cluster.kubectl(
        "auth", "can-i", verb, resource, "-n", namespace, "--as", user, check=False
    ).stdout.strip()
    assert answer == ("yes" if allowed else "no")


def test_probe_jobs_run_the_operator_pods_own_image(cluster, owner, monkeypatch):
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "dsv4-operator-5f7d9", "namespace": COMMAND_NS},
        "spec": {
            "containers": [
                {"name": "proxy", "image": "ghcr.io/example/proxy:1"},
                {"name": "operator", "image": "registry.example/dsv4/operator:1.2.3"},
            ]
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
    kube = admin(cluster)
    monkeypatch.setenv("POD_NAMESPACE", COMMAND_NS)
    monkeypatch.setenv("POD_NAME", "dsv4-operator-5f7d9")
    assert probe_image(kube, None) == "registry.example/dsv4/operator:1.2.3"
    assert probe_image(kube, "pinned:1") == "pinned:1"
    monkeypatch.delenv("POD_NAME")
    with pytest.raises(SystemExit, match="--probe-image"):
        probe_image(kube, None)


def test_a_restarted_operator_never_starts_a_second_job_for_one_attempt(cluster, owner):
    """Two executors are two operator lives: the second finds the first one's Job and, once
    it ended without a report (no local runtime runs its pod: KWOK completes it, exit 0),
    files INCONCLUSIVE instead of probing again."""
    kube = admin(cluster)
    ref = ReportRef("canary", "restart", attempt=1)
    report = ref.name(owner)
    settings = ProbeSettings(base_url="http://flash--canary-router.x.svc:8000", backend="reference")
    JobProbeExecutor(kube, kube, IMAGE).start(owner, ref, settings)
    job = wait_for(
        "the Job to end",
        lambda: (
            (j := kube.get("Job", COMMAND_NS, report))
            and job_state(j)[0] is not JobState.ACTIVE
            and j
        ),
        60,
    )
    restarted = JobProbeExecutor(kube, kube, IMAGE)
    assert not restarted.running(owner, report)
    restarted.start(owner, ref, settings)
    restarted.start(owner, ref, settings)  # every later pass, too
    assert kube.get("Job", COMMAND_NS, report)["metadata"]["uid"] == job["metadata"]["uid"]
    outcome = outcome_from_config_map(kube.get("ConfigMap", COMMAND_NS, report))
    assert outcome is not None and outcome.verdict is RolloutVerdict.INCONCLUSIVE


def test_a_running_job_is_waited_for_across_restarts_and_stopped_when_told(cluster):
    """A pod quota of zero keeps the Job active (its controller may create no pod), the way
    a probe Job waits in a busy cluster."""
    owner = create_deployment(cluster, "probe-job-held")
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-pods", "namespace": owner.namespace},
        "spec": {"hard": {"pods": "0"}},
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(quota))
    kube = admin(cluster)
    ref = ReportRef("canary", "held", attempt=1)
    report = ref.name(owner)
    settings = ProbeSettings(base_url="http://flash--canary-router.x.svc:8000", backend="reference")
    JobProbeExecutor(kube, kube, IMAGE).start(owner, ref, settings)
    job = kube.get("Job", owner.namespace, report)

    restarted = JobProbeExecutor(kube, kube, IMAGE)
    assert restarted.running(owner, report)
    restarted.start(owner, ref, settings)
    assert kube.get("Job", owner.namespace, report)["metadata"]["uid"] == job["metadata"]["uid"]

    restarted.stop(owner, report)
    wait_for("the Job gone", lambda: kube.get("Job", owner.namespace, report) is None, 30)
    assert not restarted.running(owner, report)
    # Stopped is not a verdict: the report holds none, and the rollout says what happened.
    assert outcome_from_config_map(kube.get("ConfigMap", owner.namespace, report)) is None


# -- an operator in Job mode, the local cluster's default -------------------------------------
MODE_NS = "probe-job-mode"
HICACHE_BF16 = {"hicache": {"enabled": True, "ratio": 2.0}, "indexDtype": "bf16"}
RACE = {**HICACHE_BF16, "faultInjection": {"ungatedIndexK": True}}


@pytest.fixture(scope="module")
def job_mode(cluster: LocalCluster, tmp_path_factory):
    logs = tmp_path_factory.mktemp("probe-job-mode")
    operator, runtime = operator_and_runtime(cluster, MODE_NS, logs)  # no probe flags
    owner = create_deployment(cluster, MODE_NS)
    operator.start()
    runtime.start()
    try:
        wait_for("deployment Ready", lambda: status(cluster).get("phase") == "Ready", 180)
        yield owner, operator, logs
    finally:
        cluster.kubectl("delete", "dsv4", "flash", "-n", MODE_NS, "--wait=false", check=False)
        operator.stop()
        runtime.stop()


def status(cluster: LocalCluster) -> dict:
    return get_json(cluster, "dsv4", "flash", "-n", MODE_NS).get("status") or {}


def probe_jobs(cluster: LocalCluster) -> list[dict]:
    selector = f"{LABEL_COMPONENT}={COMPONENT}"
    return get_json(cluster, "jobs", "-n", MODE_NS, "-l", selector)["items"]


def test_the_local_runtime_runs_the_probe_job_and_its_fail_fails_the_job(cluster, job_mode):
    owner, operator, logs = job_mode
    before = get_json(cluster, "statefulset", "flash-decode", "-n", MODE_NS)["spec"]["template"]
    cluster.kubectl(
        "patch", "dsv4", "flash", "-n", MODE_NS, "--type=merge",
        "-p", json.dumps({"spec": {"features": RACE}}),
    )  # fmt: skip

    (job,) = wait_for("the canary's probe Job", lambda: probe_jobs(cluster), 300, interval=1)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["image"] == LOCAL_PROBE_IMAGE and container["command"] == ["dsv4ctl"]
    # The Job reaches the canary the way a pod does: through the router Service's DNS name.
    assert container["args"][1] == f"http://flash--canary-router.{MODE_NS}.svc:8000"
    report = job["metadata"]["annotations"][ANNOTATION_REPORT]
    (ref,) = job["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"]) == ("ConfigMap", report)
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == probe_account(owner)

    rollout = wait_for(
        "rolled back",
        lambda: (r := status(cluster).get("rollout") or {}).get("phase") == "RolledBack" and r,
        VERDICT_TIMEOUT,
    )
    assert (rollout["verdict"], rollout["report"]) == ("FAIL", report)
    # The probe pod filed the verdict itself, as its own account's field manager.
    filed = admin(cluster).get("ConfigMap", MODE_NS, report)  # with its managedFields
    outcome = outcome_from_config_map(filed)
    assert outcome is not None and outcome.verdict is RolloutVerdict.FAIL
    assert PROBE_MANAGER in {m["manager"] for m in filed["metadata"]["managedFields"]}
    # It exited 1 and the Job controller, by the Job's podFailurePolicy, failed the Job.
    ended = wait_for(
        "the Job to fail",
        lambda: (
            (j := get_json(cluster, "job", job["metadata"]["name"], "-n", MODE_NS))
            and job_state(j)[0] is JobState.FAILED
            and j
        ),
        60,
    )
    assert "PodFailurePolicy" in job_state(ended)[1]
    (pod,) = get_json(cluster, "pods", "-n", MODE_NS, "-l", f"job-name={job['metadata']['name']}")[
        "items"
    ]
    assert pod["status"]["phase"] == "Failed"
    (ran,) = pod["status"]["containerStatuses"]
    assert ran["state"]["terminated"]["exitCode"] == 1
    # Its output is where `kubectl logs` would show it: the verdict table.
    assert (
        "FAIL" in (logs / f"{pod['metadata']['name']}-{pod['metadata']['uid'][:8]}.log").read_text()
    )
    # Ran once, never again: a verdict is not re-probed.
    assert [j["metadata"]["name"] for j in probe_jobs(cluster)] == [job["metadata"]["name"]]
    assert metric(operator, "dsv4_operator_canary_verdicts", verdict="FAIL") == 1
    assert metric(operator, "dsv4_operator_rollbacks") == 1
    # Production never saw the untested flags.
    after = get_json(cluster, "statefulset", "flash-decode", "-n", MODE_NS)["spec"]["template"]
    assert after == before
    assert "Traceback" not in operator.text()


def test_other_jobs_pods_are_still_kwoks_while_the_runtime_plays_probes(cluster, job_mode):
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "not-a-probe", "namespace": MODE_NS},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {LABEL_COMPONENT: "batch"}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "example/batch:1"}],
                },
            },
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(job))
    wait_for(
        "KWOK to complete the Job's pod",
        lambda: (
            job_state(get_json(cluster, "job", "not-a-probe", "-n", MODE_NS))[0]
            is JobState.SUCCEEDED
        ),
        60,
    )


def metric(operator: Background, name: str, **labels: str) -> float:
    """The operator's own counter `name` for this namespace's DSV4Deployment."""
    port = operator.command[operator.command.index("--health-port") + 1]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    wanted = {"namespace": MODE_NS, "name": "flash", **labels}
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == f"{name}_total" and wanted.items() <= sample.labels.items()
    )
