"""The operator from its image, as the installed Deployment runs it, on the local cluster, and
a canary's probe Job from that same image (`from_images` says how each runs).

The shipped reference sample goes Ready under the image's operator, then a clean flag change
(HiCache with a bf16 index-K, gated) is canaried, its probe Job PASSes from the image, and it
is promoted.  The engines are the reference engine from the venv here; test_engine_image.py
(`make test-images`) runs them from the CPU engine image.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dsv4_dev import images
from dsv4_dev.cluster.local import LocalCluster
from tests.e2e.from_images import apply_sample_until_ready, from_images, pass_a_clean_flag_change
from tests.e2e.helpers import IMAGE_OPERATOR_NAME, Installed

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
