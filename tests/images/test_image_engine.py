"""The engine image's local variants run as the operator's engine and router pods run it.

The pods are the ones `dsv4ctl render` shows for manifests/samples/flash-reference.yaml (the
operator's own rendering): their command, user and security context.  Both variants (CPU,
and production-equivalent on SGLang's GPU stack: `engine_variant_image`) must have run the
engine Dockerfile's SGLang checks and start the router (sglang-router, with its own
dependencies) with the arguments the operator renders.  The CPU variant must also serve the
reference engine, its engine.yaml the rendered one as the local runtime runs it (one CPU
process, bound to a pod IP of its own); what only the production-equivalent one can show is
test_image_engine_sglang.py's.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from dsv4_dev.cluster import pod_network
from dsv4_dev.images import BUILD_CHECKS, REPO_ROOT, host_volumes, pod_run, podman
from dsv4_dev.localrun.runtime import local_engine_yaml, router_command
from dsv4_operator.cli.render import render
from dsv4_operator.render.engine import ENGINE_PORT
from dsv4_operator.render.meta import ENGINE_CONTAINER
from dsv4_operator.render.router import ROUTER_PORT

# The CPU variant's cold build is ~7 minutes and 6.6 GB (PyPI's torch with its CUDA
# libraries): `make test` leaves these out, `make test-images` runs them on the CPU variant,
# `make test-images-sglang` on the production-equivalent one (sglang_image).
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


@pytest.fixture
def pod_ip(tmp_path: Path) -> str:
    """An address no other test or cluster of this machine binds: one of a slot this test
    claims (`pod_network`)."""
    slot = pod_network.claim(tmp_path / "claims", tmp_path / "cluster")
    return pod_network.address(slot)


def test_help(engine_variant_image: str) -> None:
    done = podman("run", "--rm", engine_variant_image, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: dsv4-engine launch")


def test_the_build_ran_the_sglang_checks(engine_variant_image: str) -> None:
    """The engine Dockerfile's build-time checks are layers of this image: its build ran
    them, on the variant's SGLang, and they passed (a failed RUN commits no layer)."""
    done = podman("history", "--no-trunc", "--format", "{{.CreatedBy}}", engine_variant_image)
    assert done.returncode == 0, done.stderr
    for check in BUILD_CHECKS:
        assert check in done.stdout


def test_image_user_is_the_pods_user(engine_variant_image: str, pod_spec: dict[str, Any]) -> None:
    """runAsNonRoot: kubelet starts the pod only if the image's user is numeric and not 0."""
    security = pod_spec["securityContext"]
    done = podman(
        "image", "inspect", "--format", "{{.Config.User}}", engine_variant_image, check=True
    )
    assert done.stdout.strip() == f"{security['runAsUser']}:{security['runAsGroup']}"


def test_serves_the_reference_engine_as_its_pod(
    engine_cpu_image: str,
    pod_spec: dict[str, Any],
    rendered: list[dict[str, Any]],
    tmp_path: Path,
    pod_ip: str,
) -> None:
    """The pod's command, user and security context; its volumes are host directories here:
    the engine config's holds the rendered engine.yaml (one CPU process on the pod's IP, as
    the local runtime runs it), the model's stays empty (the reference engine seeds its
    weights)."""
    (config_map,) = (
        o for o in rendered if o["kind"] == "ConfigMap" and f"{ROLE}.yaml" in o.get("data", {})
    )
    engine_yaml, env = local_engine_yaml(config_map["data"][f"{ROLE}.yaml"], pod_ip)
    options = [f"--env={k}={v}" for k, v in env.items()]
    options += host_volumes(pod_spec, ENGINE_CONTAINER, tmp_path, {f"{ROLE}.yaml": engine_yaml})
    name = f"dsv4-engine-test-{tmp_path.name}"
    run = pod_run(pod_spec, ENGINE_CONTAINER, engine_cpu_image, *options)
    started = podman("run", "--detach", f"--name={name}", *run)
    assert started.returncode == 0, started.stderr
    try:
        url = f"http://{pod_ip}:{ENGINE_PORT}/health"
        assert _healthy(url), podman("logs", name).stderr[-4000:]
    finally:
        podman("rm", "--force", name)


def test_starts_the_router_as_its_pod(
    engine_variant_image: str, rendered: list[dict[str, Any]], pod_ip: str
) -> None:
    """The router pod runs the engine image (the sample names no router image) with the
    command and arguments the operator renders: sglang-router, whose dependencies the image
    installs, starts, discovering by label; with no API server to discover from it serves
    no worker, and answers /health (its /readiness says it has none)."""
    (router,) = (
        o
        for o in rendered
        if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("router")
    )
    spec = router["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["image"] == pod_spec_image(rendered)
    command = router_command(container["command"], container["args"], pod_ip)
    local = {**spec, "containers": [{**container, "command": ["python3", *command[1:3]],
                                     "args": command[3:]}]}  # fmt: skip
    name = f"dsv4-router-test-{pod_ip.replace('.', '-')}"
    run = pod_run(local, "router", engine_variant_image)
    started = podman("run", "--detach", f"--name={name}", *run)
    assert started.returncode == 0, started.stderr
    try:
        url = f"http://{pod_ip}:{ROUTER_PORT}"
        assert _healthy(f"{url}/health"), podman("logs", name).stderr[-4000:]
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{url}/readiness", timeout=5)
        assert refused.value.code == 503
    finally:
        podman("rm", "--force", name)


def pod_spec_image(rendered: list[dict[str, Any]]) -> str:
    """The engine image the sample's engine pods run."""
    (workload,) = (
        o for o in rendered if o["kind"] == "StatefulSet" and o["metadata"]["name"].endswith(ROLE)
    )
    (engine,) = (
        c
        for c in workload["spec"]["template"]["spec"]["containers"]
        if c["name"] == ENGINE_CONTAINER
    )
    return engine["image"]


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
