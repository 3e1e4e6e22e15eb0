"""The operator image runs as the shipped Deployment runs it.

User, group, read-only root filesystem, the /tmp emptyDir, dropped capabilities and args
are read from manifests/base/deployment.yaml, so a change there, or in the image, that
breaks the other fails here.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from dsv4_dev.images import REPO_ROOT, pod_run, podman, run_options
from dsv4_operator.runtime import OPERATOR_CONTAINER

DEPLOYMENT = REPO_ROOT / "manifests" / "base" / "deployment.yaml"
SAMPLE = "manifests/samples/flash-b200-1p1d.yaml"


@pytest.fixture(scope="module")
def pod_spec() -> dict[str, Any]:
    return yaml.safe_load(DEPLOYMENT.read_text())["spec"]["template"]["spec"]


def test_help(operator_image: str) -> None:
    done = podman("run", "--rm", operator_image, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: dsv4-operator")


def test_image_user_is_the_manifest_user(operator_image: str, pod_spec: dict[str, Any]) -> None:
    """runAsNonRoot: kubelet starts the pod only if the image's user is numeric and not 0."""
    security = pod_spec["securityContext"]
    done = podman("image", "inspect", "--format", "{{.Config.User}}", operator_image, check=True)
    assert done.stdout.strip() == f"{security['runAsUser']}:{security['runAsGroup']}"


def test_runs_as_the_manifest_says(operator_image: str, pod_spec: dict[str, Any]) -> None:
    """Its user, a read-only root filesystem, and /tmp (the emptyDir) writable."""
    script = (
        'id -u; id -g; awk \'$2 == "/" {split($4, o, ","); print o[1]}\' /proc/mounts; '
        "touch /tmp/written && echo tmp-writable"
    )
    options = run_options(pod_spec, OPERATOR_CONTAINER)
    done = podman("run", "--rm", *options, "--entrypoint", "sh", operator_image, "-c", script)
    assert done.returncode == 0, done.stderr
    security = pod_spec["securityContext"]
    assert done.stdout.split() == [
        str(security["runAsUser"]),
        str(security["runAsGroup"]),
        "ro",
        "tmp-writable",
    ]


def test_the_deployment_command_starts(operator_image: str, pod_spec: dict[str, Any]) -> None:
    """The Deployment's own command and args, under its settings: the operator starts and
    stops where it looks for its cluster (there is none here), not before."""
    done = podman(
        "run", "--rm", "--network=none", *pod_run(pod_spec, OPERATOR_CONTAINER, operator_image)
    )
    assert done.returncode != 0
    assert "kubernetes.config.config_exception.ConfigException" in done.stderr, done.stderr


def test_dsv4ctl_renders_under_the_manifest_settings(
    operator_image: str, pod_spec: dict[str, Any]
) -> None:
    """`dsv4ctl` (what probe Jobs run) works on the read-only root: it writes nothing."""
    options = run_options(pod_spec, OPERATOR_CONTAINER)
    sample = f"{REPO_ROOT / SAMPLE}:/{SAMPLE}:ro"
    done = podman(
        "run", "--rm", *options, "-v", sample, "--entrypoint", "dsv4ctl", operator_image,
        "render", f"/{SAMPLE}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    kinds = [doc["kind"] for doc in yaml.safe_load_all(done.stdout)]
    assert "StatefulSet" in kinds and "Deployment" in kinds
