"""The production-equivalent engine image (SGLang 0.5.23 with its whole GPU stack, from the
package index) does, without a GPU, everything a GPU node's engine pod does before it needs
the GPU.

- SGLang's GPU stack is installed whole: every requirement SGLang declares is satisfied
  (`pip check`), torch is a CUDA 13 build, and the kernel packages are there.
- For each shipped sample that runs SGLang, the engine.yaml the operator renders for prefill
  and for decode becomes, in the pod as rendered, a command SGLang accepts: `dsv4-engine
  launch --check` loads SGLang's plugins and builds its `ServerArgs` with its own parser,
  what `sglang.launch_server` does before it reads the model and the GPUs.
- Run as the pod runs it, without a GPU, the launcher says so in one line, not a traceback.
- The GPU node's checks run from the image (bench/engine_image_checks.sh): the plugin and
  gate checks pass again, and the kernel check reports that it found no CUDA device.

What both local variants share (the build's checks, the user, the router) is
test_image_engine.py's.  The cold build takes tens of minutes (docs/install.md): only `make
test-images-sglang` runs this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dsv4_dev.images import REPO_ROOT, host_volumes, pod_run, podman
from dsv4_engine.commands.launch import NVIDIA_DEVICES
from dsv4_engine.engine_config import LWS_GROUP_SIZE, LWS_LEADER_ADDRESS, LWS_WORKER_INDEX
from dsv4_engine.features import Role
from dsv4_operator.cli.render import render
from dsv4_operator.render.lws import LWS_KIND
from dsv4_operator.render.meta import ENGINE_CONTAINER

pytestmark = [pytest.mark.engine_image, pytest.mark.sglang_image]

SAMPLES = sorted((REPO_ROOT / "manifests" / "samples").glob("*.yaml"))
# Kernel packages SGLang 0.5.23 requires that only its GPU stack brings (`pip check`: at its pins).
GPU_STACK = (
    "sglang-kernel", "flashinfer-python", "sgl-deep-gemm", "sgl-flash-mla", "sgl-deep-ep",
    "flash-attn-4", "nvidia-cutlass-dsl", "tilelang",
)  # fmt: skip
CHECK_S = 300  # one `--check`: importing SGLang's GPU stack on a busy 2-core machine


def sglang_engines() -> list[tuple[str, Role, dict[str, Any], str]]:
    """(sample, role, the pod spec of the role's engine -- a LeaderWorkerSet's leader --,
    the rendered engine.yaml) of every sample and role whose engine is SGLang."""
    out = []
    for sample in SAMPLES:
        docs = [d for d in yaml.safe_load_all(sample.read_text()) if d]
        if not docs or docs[0].get("kind") != "DSV4Deployment":
            continue  # the kustomization
        rendered = render(docs[0], namespace=None)
        for role in (Role.PREFILL, Role.DECODE):
            key = f"{role.value}.yaml"
            (text,) = (o["data"][key] for o in rendered if key in o.get("data", {}))
            if yaml.safe_load(text)["backend"] != "sglang":
                continue
            (workload,) = (
                o
                for o in rendered
                if o["kind"] in ("StatefulSet", LWS_KIND)
                and o["metadata"]["name"].endswith(role.value)
            )
            out.append((sample.stem, role, workload, text))
    return out


ENGINES = sglang_engines()


def pod_spec_and_env(workload: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The engine's pod spec, and the environment LeaderWorkerSet's webhook gives a group's
    leader (none for a StatefulSet's pod)."""
    if workload["kind"] != LWS_KIND:
        return workload["spec"]["template"]["spec"], []
    template = workload["spec"]["leaderWorkerTemplate"]
    name = workload["metadata"]["name"]
    env = {
        LWS_LEADER_ADDRESS: f"{name}-0.{name}.default",
        LWS_WORKER_INDEX: "0",
        LWS_GROUP_SIZE: str(template["size"]),
    }
    return template["leaderTemplate"]["spec"], [f"--env={k}={v}" for k, v in env.items()]


def run_engine_pod(
    image: str, workload: dict[str, Any], role: Role, engine_yaml: str, tmp: Path, *args: str
) -> Any:
    """The engine container as its pod runs it (command, user, security context, its
    engine.yaml where its ConfigMap volume puts it), ``args`` added to its command."""
    spec, env = pod_spec_and_env(workload)
    options = env + host_volumes(spec, ENGINE_CONTAINER, tmp, {f"{role.value}.yaml": engine_yaml})
    containers = [{**c, "args": list(args)} for c in spec["containers"]]
    run = pod_run({**spec, "containers": containers}, ENGINE_CONTAINER, image, *options)
    return podman("run", "--rm", "--network=none", *run, timeout=CHECK_S)


def test_sglangs_gpu_stack_is_installed_whole(engine_sglang_image: str) -> None:
    script = (
        "import importlib.metadata as m, torch; print(torch.version.cuda); "
        f"print(*(m.version(p) for p in {GPU_STACK!r}))"
    )
    check = podman(
        "run", "--rm", "--entrypoint", "python3", engine_sglang_image, "-m", "pip", "check"
    )
    assert check.returncode == 0, check.stdout + check.stderr
    done = podman("run", "--rm", "--entrypoint", "python3", engine_sglang_image, "-c", script)
    assert done.returncode == 0, done.stderr[-4000:]
    cuda, versions = done.stdout.splitlines()[-2:]
    assert cuda.startswith("13."), cuda
    assert len(versions.split()) == len(GPU_STACK)


def test_the_samples_run_sglang_on_prefill_and_decode() -> None:
    assert {(sample, role) for sample, role, _, _ in ENGINES} >= {
        ("flash-b200-1p1d", Role.PREFILL), ("flash-b200-1p1d", Role.DECODE),
        ("pro-gb200-nvl72", Role.PREFILL), ("pro-gb200-nvl72", Role.DECODE),
    }  # fmt: skip


@pytest.mark.parametrize(
    ("sample", "role", "workload", "engine_yaml"),
    ENGINES,
    ids=[f"{sample}-{role.value}" for sample, role, _, _ in ENGINES],
)
def test_each_samples_engine_yaml_is_a_command_sglang_accepts(
    engine_sglang_image: str,
    sample: str,
    role: Role,
    workload: dict[str, Any],
    engine_yaml: str,
    tmp_path: Path,
) -> None:
    done = run_engine_pod(engine_sglang_image, workload, role, engine_yaml, tmp_path, "--check")
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert lines[-2].split()[1:4] == ["-m", "sglang.launch_server", "--model-path"]
    assert lines[-1] == (
        "# accepted by SGLang 0.5.23's load_plugins(), parser and ServerArgs; not started"
    )


def test_without_a_gpu_the_engine_names_the_missing_device(
    engine_sglang_image: str, tmp_path: Path
) -> None:
    """The pod as rendered, on a machine without a GPU: one line, exit 2, SGLang not run."""
    _, role, workload, engine_yaml = ENGINES[0]
    done = run_engine_pod(engine_sglang_image, workload, role, engine_yaml, tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"dsv4-engine launch: error: backend: sglang needs NVIDIA GPUs and this container has "
        f"none (no {NVIDIA_DEVICES}): its pod must request nvidia.com/gpu on a GPU node; not "
        "starting SGLang (--check checks the command without one)"
    )


def test_the_gpu_nodes_checks_run_from_the_image(engine_sglang_image: str) -> None:
    """docs/install.md's command, without --gpus: the checks that need no GPU pass, the
    kernel check finds no CUDA device and says nothing was checked (exit 2)."""
    bench = f"{REPO_ROOT / 'bench'}:/bench:ro"
    done = podman(
        "run", "--rm", "-v", bench, "--entrypoint", "/bench/engine_image_checks.sh",
        engine_sglang_image, timeout=CHECK_S,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-4000:]
    assert "load check: SGLang 0.5.23's load_plugins() loaded dsv4_index_k" in done.stdout
    assert "gate check: SGLang 0.5.23: every DeepSeek-V4 pool getter waits" in done.stdout
    assert "no CUDA device here" in done.stderr and "nothing was checked" in done.stderr
