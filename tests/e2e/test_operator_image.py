"""The operator from its image, as the installed Deployment runs it, on the local cluster, and
a canary's probe Job from that same image.

The operator image (hack/images.sh) runs under podman with the installed Deployment's own
args, user, read-only root filesystem, /tmp emptyDir and capabilities, and nothing but its
ServiceAccount's token (`installed_operator(image=...)`).  The install is the shipped one
(manifests/base), its settings given the sample's model directory as a platform team
would.  The local runtime runs each probe Job pod from the image the operator put in the
Job — the operator pod's own — mapped to the local build (`$DSV4_LOCALRUN_IMAGES`), under
the Job's own security settings.  The engines are the reference engine from the venv (the
CPU engine image is run by `make test-images`).

The shipped reference sample goes Ready under the image's operator, then a clean flag change
(HiCache with a bf16 index-K, gated) is canaried, its probe Job PASSes from the image, and it
is promoted.  The canary judges against a 5% budget (`spec.canary`, as a user sets it): the
evidence the default canary demands is test_rollout.py's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from dsv4_dev import images
from dsv4_dev.cluster.local import LocalCluster
from dsv4_operator.api.samples import shipped_sample
from dsv4_operator.render.meta import LABEL_COMPONENT
from dsv4_operator.rollout.probe_job import COMPONENT
from dsv4_operator.rollout.reports import PROBE_MANAGER
from tests.e2e.escapes import SERVED
from tests.e2e.helpers import (
    IMAGE_OPERATOR_NAME,
    MANIFESTS,
    Installed,
    get_json,
    installed_operator,
    local_runtime,
    wait_for,
)
from tests.unit.operator.harness import MODEL_HOST_PATHS

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.images]

NS = "dsv4-image-e2e"
NAME = "flash"
BUDGET = {"maxCorruptionRate": 0.05, "concurrency": 16}
HICACHE_BF16 = {"hicache": {"enabled": True, "ratio": 2.0}, "indexDtype": "bf16"}
VERDICT_TIMEOUT = 600


def operator_image_name(installed: Installed) -> str:
    """The image the installed Deployment's pod runs: the one its probe Jobs get."""
    deployment = next(o for o in installed.objects if o["kind"] == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container["image"]


@pytest.fixture(scope="module")
def running(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Installed, str]]:
    image = images.build("operator")
    workdir = tmp_path_factory.mktemp("operator-image")
    cluster.kubectl("create", "namespace", NS)
    cluster.kubectl("label", "namespace", NS, f"{SERVED}=true")
    settings = {"allowedModelHostPaths": ",".join(MODEL_HOST_PATHS)}
    runtime = None
    try:
        with installed_operator(
            cluster, MANIFESTS / "base", workdir, image=image, settings=settings
        ) as installed:
            runtime = local_runtime(cluster, workdir, {operator_image_name(installed): image})
            runtime.start()
            yield installed, image
    finally:
        cluster.kubectl("delete", "dsv4", NAME, "-n", NS, "--wait=false", check=False)
        if runtime is not None:
            runtime.stop()
        # Give the GPUs of the fake nodes back to the tests that run after this module.
        cluster.kubectl("delete", "namespace", NS, "--wait=true", "--timeout=120s")


def status(cluster: LocalCluster) -> dict[str, Any]:
    return get_json(cluster, "dsv4", NAME, "-n", NS).get("status") or {}


def test_the_operator_image_reconciles_a_sample_to_ready(
    cluster: LocalCluster, running: tuple[Installed, str]
) -> None:
    installed, _ = running
    sample = shipped_sample("flash-reference")
    cluster.kubectl("apply", "-n", NS, "-f", "-", input=json.dumps(sample))

    def ready() -> bool:
        assert installed.proc.poll() is None, (
            f"operator exited: {installed.log.read_text()[-3000:]}"
        )
        return status(cluster).get("phase") == "Ready"

    wait_for("sample flash Ready, reconciled by the operator image", ready, timeout=180)
    # It was the container, as the Deployment runs it.
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
    assert status(cluster).get("phase") == "Ready", "the sample from the test before"
    before = status(cluster).get("rollout") or {}
    patch = {"spec": {"features": HICACHE_BF16, "canary": BUDGET}}
    cluster.kubectl("patch", "dsv4", NAME, "-n", NS, "--type=merge", "-p", json.dumps(patch))
    started = wait_for(
        "a canary for the flag change",
        lambda: (
            (r := status(cluster).get("rollout") or {}).get("canaryRevision")
            not in (None, before.get("canaryRevision"))
            and r
        ),
        120,
    )
    done = wait_for(
        "the verdict",
        lambda: (
            (
                (r := status(cluster).get("rollout") or {}).get("phase") == "RolledBack"
                or (
                    r.get("phase") == "Idle"
                    and r.get("stableRevision") == started["canaryRevision"]
                )
            )
            and r
        ),
        VERDICT_TIMEOUT,
    )
    assert (done["phase"], done["verdict"]) == ("Idle", "PASS"), (
        done.get("verdictReason"),
        installed.log.read_text()[-3000:],
    )
    assert done["stableRevision"] == started["canaryRevision"], "promoted"
    # The probe Job's pod ran the operator pod's own image, this build of it, and its
    # probe filed the PASS as the probe account.
    selector = f"{LABEL_COMPONENT}={COMPONENT}"
    (job,) = get_json(cluster, "jobs", "-n", NS, "-l", selector)["items"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["image"] == operator_image_name(installed)
    (pod,) = get_json(cluster, "pods", "-n", NS, "-l", f"job-name={job['metadata']['name']}")[
        "items"
    ]
    (ran,) = pod["status"]["containerStatuses"]
    built = images.podman("image", "inspect", "--format", "{{.Id}}", image, check=True)
    assert ran["imageID"] == f"sha256:{built.stdout.strip()}"
    assert (pod["status"]["phase"], ran["state"]["terminated"]["exitCode"]) == ("Succeeded", 0)
    report = get_json(cluster, "configmap", done["report"], "-n", NS, "--show-managed-fields")
    assert PROBE_MANAGER in {m["manager"] for m in report["metadata"]["managedFields"]}
    wait_for("the new revision Ready", lambda: status(cluster).get("phase") == "Ready", 300)
