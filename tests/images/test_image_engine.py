"""The engine image's CPU variant runs as the operator's engine pods run it.

The pod is the one `dsv4ctl render` shows for manifests/samples/flash-reference.yaml (the
operator's own rendering): its command, user and security context; its engine.yaml is the
rendered one as the local runtime runs it (one CPU process, a free port).  The image must
serve the reference engine under all of that.
"""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from dsv4_dev.images import REPO_ROOT, host_volumes, pod_run, podman
from dsv4_dev.localrun.runtime import free_port, local_engine_yaml
from dsv4_operator.cli.render import render
from dsv4_operator.render.meta import ENGINE_CONTAINER

# The cold build is ~7 minutes and 6.6 GB (PyPI's torch with its CUDA libraries): `make
# test` leaves these out, `make test-images` runs them.
pytestmark = pytest.mark.engine_image

SAMPLE = REPO_ROOT / "manifests" / "samples" / "flash-reference.yaml"
ROLE = "prefill"
READY_WITHIN_S = 180


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    return render(yaml.safe_load(SAMPLE.read_text()), namespace=None)


@pytest.fixture(scope="module")
def pod_spec(rendered: list[dict[str, Any]]) -> dict[str, Any]:
    (workload,) = (
        o for o in rendered if o["kind"] == "StatefulSet" and o["metadata"]["name"].endswith(ROLE)
    )
    return workload["spec"]["template"]["spec"]


def test_help(engine_cpu_image: str) -> None:
    done = podman("run", "--rm", engine_cpu_image, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: dsv4-engine launch")


def test_the_build_ran_the_sglang_checks(engine_cpu_image: str) -> None:
    """The engine Dockerfile's build-time checks are layers of this image: its build ran
    them, on the CPU variant's SGLang, and they passed (a failed RUN commits no layer)."""
    done = podman("history", "--no-trunc", "--format", "{{.CreatedBy}}", engine_cpu_image)
    assert done.returncode == 0, done.stderr
    assert "sglang.__version__ == '0.5.23'" in done.stdout
    assert "'dsv4_index_k' in e(group='sglang.srt.plugins').names" in done.stdout
    assert "python3 -m dsv4_engine.sglang_plugin.gate_check" in done.stdout


def test_image_user_is_the_pods_user(engine_cpu_image: str, pod_spec: dict[str, Any]) -> None:
    """runAsNonRoot: kubelet starts the pod only if the image's user is numeric and not 0."""
    security = pod_spec["securityContext"]
    done = podman("image", "inspect", "--format", "{{.Config.User}}", engine_cpu_image, check=True)
    assert done.stdout.strip() == f"{security['runAsUser']}:{security['runAsGroup']}"


def test_serves_the_reference_engine_as_its_pod(
    engine_cpu_image: str, pod_spec: dict[str, Any], rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    """The pod's command, user and security context; its volumes are host directories here:
    the engine config's holds the rendered engine.yaml (one CPU process, a free port, as the
    local runtime runs it), the model's stays empty (the reference engine seeds its weights)."""
    (config_map,) = (
        o for o in rendered if o["kind"] == "ConfigMap" and f"{ROLE}.yaml" in o.get("data", {})
    )
    port = free_port()
    engine_yaml, env = local_engine_yaml(config_map["data"][f"{ROLE}.yaml"], port, free_port())
    options = [f"--env={k}={v}" for k, v in env.items()]
    options += host_volumes(pod_spec, ENGINE_CONTAINER, tmp_path, {f"{ROLE}.yaml": engine_yaml})
    name = f"dsv4-engine-test-{port}"
    run = pod_run(pod_spec, ENGINE_CONTAINER, engine_cpu_image, *options)
    started = podman("run", "--detach", f"--name={name}", *run)
    assert started.returncode == 0, started.stderr
    try:
        assert _healthy(f"http://127.0.0.1:{port}/health"), podman("logs", name).stderr[-4000:]
    finally:
        podman("rm", "--force", name)


def _healthy(url: str) -> bool:
    deadline = time.monotonic() + READY_WITHIN_S
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(1)
    return False
