"""The operator from its image, as the installed Deployment runs it, on the local cluster.

The operator image (hack/images.sh) runs under podman with the installed Deployment's own
args, user, read-only root filesystem, /tmp emptyDir and capabilities, and nothing but its
ServiceAccount's token (`installed_operator(image=...)`); it reconciles the shipped flash
sample to Ready.  Not run from an image here: a probe Job's pod (KWOK runs no container)
and the engines.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from dsv4_dev import images
from dsv4_dev.cluster.local import LocalCluster
from tests.e2e.escapes import SERVED
from tests.e2e.helpers import (
    IMAGE_OPERATOR_NAME,
    MANIFESTS,
    Installed,
    get_json,
    installed_operator,
    kustomize,
    model_claim,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.images]

NS = "dsv4-image-e2e"


@pytest.fixture(scope="module")
def running(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Installed, dict[str, Any]]]:
    image = images.build("operator")
    workdir = tmp_path_factory.mktemp("operator-image")
    sample = next(
        o for o in kustomize(cluster, MANIFESTS / "samples") if o["metadata"]["name"] == "flash"
    )
    cluster.kubectl("create", "namespace", NS)
    cluster.kubectl("label", "namespace", NS, f"{SERVED}=true")
    model_claim(cluster, NS, sample["spec"]["model"]["pvc"]["claimName"])
    try:
        with installed_operator(cluster, MANIFESTS / "base", workdir, image=image) as installed:
            yield installed, sample
    finally:
        # Give the GPUs of the fake nodes back to the tests that run after this module.
        cluster.kubectl("delete", "namespace", NS, "--wait=true", "--timeout=120s")


def test_the_operator_image_reconciles_a_sample_to_ready(
    cluster: LocalCluster, running: tuple[Installed, dict[str, Any]]
) -> None:
    installed, sample = running
    cluster.kubectl("apply", "-n", NS, "-f", "-", input=json.dumps(sample))

    def ready() -> bool:
        assert installed.proc.poll() is None, (
            f"operator exited: {installed.log.read_text()[-3000:]}"
        )
        status = get_json(cluster, "dsv4", "flash", "-n", NS).get("status") or {}
        return status.get("phase") == "Ready"

    wait_for("sample flash Ready, reconciled by the operator image", ready, timeout=180)
    # It was the container, as the Deployment runs it.
    pod_spec = next(o for o in installed.objects if o["kind"] == "Deployment")["spec"]["template"]
    security = pod_spec["spec"]["securityContext"]
    user = images.podman("exec", IMAGE_OPERATOR_NAME, "id", "-u", check=True).stdout.strip()
    assert user == str(security["runAsUser"])
    read_only = images.podman(
        "inspect", "--format", "{{.HostConfig.ReadonlyRootfs}}", IMAGE_OPERATOR_NAME, check=True
    )
    assert read_only.stdout.strip() == "true"
