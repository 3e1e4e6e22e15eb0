"""The operator from its image, as the installed Deployment runs it, on the local cluster, and
a canary's probe Job from that same image (`from_images` says how each runs).

The shipped reference sample goes Ready under the image's operator, then a clean flag change
(HiCache with a bf16 index-K, gated) is canaried, its probe Job PASSes from the image, and it
is promoted.  Then a namespace editor attacks the gate's evidence as a security review did
(issue 62), and a PASS put where a retry's report goes FAILs that attempt.  The engines are the reference engine from the venv here; test_engine_image.py
(`make test-images`) runs them from the CPU engine image.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dsv4_dev import images
from dsv4_dev.cluster.local import LocalCluster
from dsv4_operator.render.meta import LABEL_COMPONENT
from dsv4_operator.render.network import SCRAPER_NAMESPACE_LABEL
from dsv4_operator.rollout import manual
from dsv4_operator.rollout.manual import ANNOTATION
from dsv4_operator.rollout.probe_job import COMPONENT
from dsv4_operator.rollout.reports import ANNOTATION_VERDICT, PROBE_MANAGER, REPORT_COMPONENT
from tests.e2e.from_images import (
    HICACHE_BF16,
    NAME,
    VERDICT_TIMEOUT,
    apply_sample_until_ready,
    from_images,
    pass_a_clean_flag_change,
    status,
)
from tests.e2e.helpers import (
    IMAGE_OPERATOR_NAME,
    Installed,
    account_kubeconfig,
    as_account,
    get_json,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.images]

NS = "dsv4-image-e2e"


@pytest.fixture(scope="module")
def running(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Installed, str]]:
    with from_images(cluster, NS, tmp_path_factory.mktemp("operator-image")) as running:
        yield running


def test_the_operator_image_reconciles_a_sample_to_ready(
    cluster: LocalCluster, running: tuple[Installed, str]
) -> None:
    installed, _ = running
    apply_sample_until_ready(cluster, installed, NS)
    # It was the container, as the Deployment runs it: its user, its read-only root.
    pod_spec = next(o for o in installed.objects if o["kind"] == "Deployment")["spec"]["template"]
    security = pod_spec["spec"]["securityContext"]
    user = images.podman("exec", IMAGE_OPERATOR_NAME, "id", "-u", check=True).stdout.strip()
    assert user == str(security["runAsUser"]) == "10001"
    read_only = images.podman(
        "inspect", "--format", "{{.HostConfig.ReadonlyRootfs}}", IMAGE_OPERATOR_NAME, check=True
    )
    assert read_only.stdout.strip() == "true"
    written = images.podman("exec", IMAGE_OPERATOR_NAME, "touch", "/opt/dsv4/x")
    assert written.returncode != 0 and "Read-only file system" in written.stderr


def test_a_clean_flag_change_passes_its_probe_job_run_from_the_image_and_is_promoted(
    cluster: LocalCluster, running: tuple[Installed, str]
) -> None:
    installed, image = running
    pass_a_clean_flag_change(cluster, installed, image, NS)


# -- evidence no one can forge (issue 62): a namespace editor against the gate ---------------
TENANT = "tenant"  # Kubernetes' built-in `edit` in the namespace, no rights on DSV4Deployments
OWNER = "owner"  # may patch the DSV4Deployment; rollout verbs only as bound below
RACE = {**HICACHE_BF16, "faultInjection": {"ungatedIndexK": True}}
REPORT_FENCE = "dsv4-report-fence"
ACCOUNTS_FENCE = "dsv4-probe-accounts-fence"
EXEC_FENCE = "dsv4-probe-exec-fence"
ACTIONS_FENCE = "dsv4-rollout-actions"


@pytest.fixture(scope="module")
def accounts(cluster: LocalCluster, running, tmp_path_factory) -> dict[str, Path]:
    """Kubeconfigs holding only the token of the tenant and of the deployment's owner."""
    folder = tmp_path_factory.mktemp("accounts")
    owner_role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": OWNER, "namespace": NS},
        "rules": [
            {
                "apiGroups": ["inference.dsv4.dev"],
                "resources": ["dsv4deployments"],
                "verbs": ["get", "list", "watch", "patch"],
            }
        ],
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(owner_role))
    # RBAC lets the tenant ask for any token of its namespace: what refuses the probe
    # account's is the fence.
    tokens = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "tokens", "namespace": NS},
        "rules": [{"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]}],
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(tokens))
    cluster.kubectl(
        "create", "rolebinding", "tenant-tokens", "--role=tokens",
        f"--serviceaccount={NS}:{TENANT}", "-n", NS,
    )  # fmt: skip
    for account, role in ((TENANT, "clusterrole=edit"), (OWNER, f"role={OWNER}")):
        cluster.kubectl("create", "serviceaccount", account, "-n", NS)
        cluster.kubectl(
            "create", "rolebinding", account, f"--{role}", f"--serviceaccount={NS}:{account}",
            "-n", NS,
        )  # fmt: skip
    return {
        account: account_kubeconfig(cluster, NS, account, folder / f"{account}.yaml")
        for account in (TENANT, OWNER)
    }


def refused(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert result.returncode != 0, result.stdout
    assert all(n in result.stderr for n in needles), result.stderr
    return result.stderr


def test_a_namespace_editor_can_neither_write_a_report_nor_act_as_the_probe(
    cluster: LocalCluster, running: tuple[Installed, str], accounts: dict[str, Path]
) -> None:
    """The gate's evidence is written only by the operator and by a pod of the attempt's own
    probe Job: an editor of the namespace can create no report, change none (the PASS just
    filed included), and can run nothing as the probe account that could."""
    tenant = accounts[TENANT]
    done = status(cluster, NS)["rollout"]
    filed = get_json(cluster, "configmap", done["report"], "-n", NS)
    labels = filed["metadata"]["labels"]
    forged = {"apiVersion": "v1", "kind": "ConfigMap", "data": filed["data"]}
    forged["metadata"] = {"name": "forged-report", "namespace": NS, "labels": labels}
    refused(
        as_account(tenant, "create", "-f", "-", input=json.dumps(forged)),
        REPORT_FENCE, "only the operator creates rollout reports",
    )  # fmt: skip
    refused(
        as_account(tenant, "annotate", "configmap", done["report"], "-n", NS, "x=y"),
        REPORT_FENCE, "written only by the operator and by a pod of its probe Job",
    )  # fmt: skip
    job = next(
        j
        for j in get_json(cluster, "jobs", "-n", NS, "-l", f"{LABEL_COMPONENT}={COMPONENT}")[
            "items"
        ]
    )
    spec = job["spec"]["template"]["spec"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "as-the-probe", "namespace": NS},
        "spec": {**spec, "restartPolicy": "Never"},
    }
    refused(
        as_account(tenant, "create", "-f", "-", input=json.dumps(pod)),
        ACCOUNTS_FENCE, "as only the pods the Job controller makes",
    )  # fmt: skip
    made = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "as-the-probe"}}
    made["spec"] = {"template": {"spec": {**spec, "restartPolicy": "Never"}}}
    refused(
        as_account(tenant, "create", "-n", NS, "-f", "-", input=json.dumps(made)),
        ACCOUNTS_FENCE, "as only the operator's probe Jobs do",
    )  # fmt: skip
    refused(
        as_account(tenant, "create", "token", spec["serviceAccountName"], "-n", NS),
        ACCOUNTS_FENCE, "its tokens go only to the node",
    )  # fmt: skip
    (probe_pod,) = get_json(cluster, "pods", "-n", NS, "-l", f"job-name={job['metadata']['name']}")[
        "items"
    ]
    # Nor can it open the engines' NetworkPolicy to its own pods: a scraper is admitted only
    # from a namespace the cluster administrator labelled.
    refused(
        as_account(tenant, "label", "namespace", NS, f"{SCRAPER_NAMESPACE_LABEL}=true"),
        "cannot patch resource \"namespaces\"",
    )  # fmt: skip
    # The exec request itself (kubectl refuses a finished pod before asking): the API server
    # admits a CONNECT before it looks at the pod.
    name = probe_pod["metadata"]["name"]
    connect = f"/api/v1/namespaces/{NS}/pods/{name}/exec?command=true&stdout=true"
    refused(
        as_account(tenant, "create", "--raw", connect, "-f", "-", input="{}"),
        EXEC_FENCE, "whose token files a rollout's verdict",
    )  # fmt: skip


def test_a_pass_put_where_the_next_attempt_files_fails_that_attempt(
    cluster: LocalCluster, running: tuple[Installed, str], accounts: dict[str, Path]
) -> None:
    """The review's forged PASS: a change FAILs; a namespace editor puts a PASS where the
    retry's report will go (its name follows from the status: `<name>-canary-<revision>-<n>`) (a ConfigMap of its name, unlabelled as the fence allows, written
    as the probe's field manager); the owner retries.  The operator creates each report
    itself and finds that name taken: the attempt FAILs ("evidence existed before the
    run"), runs no probe, and nothing is promoted.  Retrying takes the verb `retry`."""
    installed, _ = running
    stable = status(cluster, NS)["rollout"]["stableRevision"]
    cluster.kubectl(
        "patch",
        "dsv4",
        NAME,
        "-n",
        NS,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"features": RACE}}),
    )
    failed = wait_for(
        "the race to FAIL",
        lambda: (
            (r := status(cluster, NS).get("rollout") or {}).get("phase") == "RolledBack"
            and r.get("rejectedRevision") not in (None, stable)
            and r
        ),
        VERDICT_TIMEOUT,
    )
    assert failed["verdict"] == "FAIL", failed
    selector = f"{LABEL_COMPONENT}={REPORT_COMPONENT}"
    passed = next(
        cm
        for cm in get_json(cluster, "configmaps", "-n", NS, "-l", selector)["items"]
        if (cm["metadata"].get("annotations") or {}).get(ANNOTATION_VERDICT) == "PASS"
    )
    attempt = failed["probeAttempt"] + 1  # the retry's: attempts count on across revisions
    next_report = re.sub(r"-\d+$", f"-{attempt}", failed["report"])
    assert next_report != failed["report"]
    forged = {"apiVersion": "v1", "kind": "ConfigMap", "data": passed["data"]}
    forged["metadata"] = {
        "name": next_report,
        "namespace": NS,
        "annotations": passed["metadata"].get("annotations") or {},
    }
    made = as_account(
        accounts[TENANT], "apply", "--server-side", f"--field-manager={PROBE_MANAGER}",
        "-f", "-", input=json.dumps(forged),
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    bogus = ["annotate", "dsv4", NAME, "-n", NS, f"{ANNOTATION}=rollback/1/x", "--overwrite"]
    refused(as_account(accounts[OWNER], *bogus), ACTIONS_FENCE, "is none of promote")
    retry = ["rollout", "retry", NAME, "-n", NS, "--kubeconfig", str(accounts[OWNER])]
    refused(dsv4ctl(*retry), ACTIONS_FENCE, "needs the verb retry")
    cluster.kubectl(
        "create", "rolebinding", f"{OWNER}-retry", "--clusterrole=dsv4-rollout-retry",
        f"--serviceaccount={NS}:{OWNER}", "-n", NS,
    )  # fmt: skip
    # RBAC grants reach the authorizer the fence asks within moments: until then, refused.
    wait_for("the retry admitted", lambda: dsv4ctl(*retry).returncode == 0, 30)
    # Who asked is the writer, as the API server authenticated it: the control names the
    # owner's account, and no one may write it under another name.
    owner = f"system:serviceaccount:{NS}:{OWNER}"
    annotations = get_json(cluster, "dsv4", NAME, "-n", NS)["metadata"]["annotations"]
    assert annotations[manual.BY_ANNOTATION] == owner
    forged = [f"{manual.BY_ANNOTATION}=someone-else", "--overwrite"]
    refused(
        as_account(accounts[OWNER], "annotate", "dsv4", NAME, "-n", NS, *forged),
        ACTIONS_FENCE,
        "rollout-action-by names someone-else but",
    )
    done = wait_for(
        "the retry's verdict",
        lambda: (
            (r := status(cluster, NS).get("rollout") or {}).get("phase") == "RolledBack"
            and r.get("probeAttempt") == attempt
            and r
        ),
        VERDICT_TIMEOUT,
    )
    assert done["verdict"] == "FAIL", done
    assert "evidence existed before the run" in done["verdictReason"], done["verdictReason"]
    asked = [e["message"] for e in get_json(cluster, "events", "-n", NS)["items"]
             if e["reason"] == "RetryRequested"]  # fmt: skip
    assert any(m.endswith(f"asked by {owner}") for m in asked), asked
    assert (
        done["stableRevision"] == stable and done["rejectedRevision"] == failed["rejectedRevision"]
    )
    assert cluster.kubectl("get", "job", next_report, "-n", NS, check=False).returncode != 0
    assert installed.proc.poll() is None


def dsv4ctl(*args: str) -> subprocess.CompletedProcess[str]:
    """dsv4ctl with only the credential its --kubeconfig names."""
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    command = [str(Path(sys.executable).with_name("dsv4ctl")), *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
