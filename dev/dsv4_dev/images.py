"""The project's images on this machine: built by hack/images.sh, run with podman as a pod would.

Why here: the tests run what ships, under the settings the shipped manifests and the
operator's rendered pods give it.  `run_options` turns a pod spec's container settings (user
and group, read-only root filesystem, emptyDir mounts, capabilities, privilege escalation)
into podman options, so a test reads them from the manifest instead of restating them.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "hack" / "images.sh"
# podman's settings for this machine kind (runc, cgroupfs, ulimits, host network).
CONTAINERS_CONF = REPO_ROOT / "hack" / "containers.conf"
# Where a container run as a pod finds its kubeconfig ($KUBECONFIG), mounted read-only:
# what a pod's mounted ServiceAccount token is to it.
CONTAINER_KUBECONFIG = "/var/run/dsv4/kubeconfig"
# The engine Dockerfile's build-time checks (images/engine/Dockerfile), as an image's history
# records the RUN that ran them: SGLang's version, the plugin loaded by SGLang's own
# load_plugins() with every hook applied, and the HiCache gate on SGLang's pool classes.
BUILD_CHECKS = (
    "sglang.__version__ == '0.5.23'",
    "python3 -m dsv4_engine.sglang_plugin.load_check",
    "python3 -m dsv4_engine.sglang_plugin.gate_check",
)


def build(target: str) -> str:
    """Builds (or finds cached) the image `target` (operator, engine-cpu, engine-sglang);
    returns its name."""
    done = subprocess.run(
        [str(BUILD_SCRIPT), target], check=True, stdout=subprocess.PIPE, text=True
    )
    return done.stdout.split()[-1]


def podman(*args: str, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess:
    """`podman ARGS`, with this machine's settings; stdout and stderr captured as text."""
    env = {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}
    return subprocess.run(
        ["podman", *args], env=env, capture_output=True, text=True, timeout=timeout, check=check
    )


def container(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    """The container `name` of `pod_spec`."""
    for c in pod_spec["containers"]:
        if c["name"] == name:
            return c
    raise KeyError(f"no container {name!r} in the pod spec")


def run_options(pod_spec: dict[str, Any], name: str) -> list[str]:
    """`podman run` options for container `name` as the pod spec runs it: its user, security
    context and emptyDirs (tmpfs mounts, writable by its user as kubelet makes them).  The other
    volumes (`other_volumes`) are the caller's to mount."""
    c = container(pod_spec, name)
    return _security(pod_spec, c) + _empty_dirs(pod_spec, c)


def pod_run(pod_spec: dict[str, Any], name: str, image: str, *options: str) -> list[str]:
    """`podman run` arguments that run container `name` of the pod spec from `image`: its
    settings and literal environment, then `options` (a later `--env` wins), then its
    command (which replaces the image's entrypoint) and args (which replace its CMD)."""
    c = container(pod_spec, name)
    entrypoint = ["--entrypoint", json.dumps(c["command"])] if c.get("command") else []
    env = [f"--env={e['name']}={e['value']}" for e in c.get("env", []) if "value" in e]
    return [*run_options(pod_spec, name), *env, *options, *entrypoint, image, *c.get("args", [])]


def podman_run(
    pod_spec: dict[str, Any], name: str, image: str, container_name: str, *options: str
) -> list[str]:
    """The `podman run` command line (removed when it exits, named ``container_name``) that
    runs container `name` of the pod spec from ``image`` as `pod_run` says."""
    return [
        "podman", "run", "--rm", f"--name={container_name}",
        *pod_run(pod_spec, name, image, *options),
    ]  # fmt: skip


def run_as_pod(
    pod_spec: dict[str, Any],
    name: str,
    image: str,
    container_name: str,
    kubeconfig: Path,
    args: list[str],
    env: dict[str, str] | None = None,
) -> list[str]:
    """`podman_run` of container `name` with ``args`` for its own, ``env`` added, and
    ``kubeconfig`` (which its user must be able to read) mounted read-only as its
    $KUBECONFIG, as the pod's ServiceAccount token would be."""
    c = container(pod_spec, name)
    spec = {**pod_spec, "containers": [{**c, "args": args}]}
    variables = {**(env or {}), "KUBECONFIG": CONTAINER_KUBECONFIG}
    return podman_run(
        spec,
        name,
        image,
        container_name,
        f"--volume={kubeconfig}:{CONTAINER_KUBECONFIG}:ro",
        *(f"--env={k}={v}" for k, v in variables.items()),
    )


def run_as_user(pod_spec: dict[str, Any], name: str) -> int | None:
    """The user container `name` of the pod spec runs as (its own setting, else the pod's)."""
    own = container(pod_spec, name).get("securityContext") or {}
    return own.get("runAsUser", (pod_spec.get("securityContext") or {}).get("runAsUser"))


def _security(pod_spec: dict[str, Any], c: dict[str, Any]) -> list[str]:
    pod = pod_spec.get("securityContext", {})
    own = c.get("securityContext", {})
    user = run_as_user(pod_spec, c["name"])
    group = own.get("runAsGroup", pod.get("runAsGroup"))
    options = []
    if user is not None:
        options += ["--user", f"{user}:{group}" if group is not None else str(user)]
    if own.get("readOnlyRootFilesystem"):
        # podman's --read-only adds tmpfs mounts of its own (/tmp, /run ...); kubelet does not.
        options += ["--read-only", "--read-only-tmpfs=false"]
    if own.get("allowPrivilegeEscalation") is False:
        options += ["--security-opt", "no-new-privileges"]
    capabilities = own.get("capabilities", {})
    options += [f"--cap-drop={cap}" for cap in capabilities.get("drop", [])]
    options += [f"--cap-add={cap}" for cap in capabilities.get("add", [])]
    return options


def _empty_dirs(pod_spec: dict[str, Any], c: dict[str, Any]) -> list[str]:
    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    options = []
    for mount in c.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "emptyDir" not in volume:
            continue
        # U: owned by the container's user.  podman 4.3 gives a tmpfs at a directory the
        # image has (the engine image's HOME) that directory's mode, root-owned, whatever
        # `mode` says; kubelet's emptyDir, and each subPath of it, the pod's user can write.
        options += ["--tmpfs", f"{mount['mountPath']}:rw,mode=1777,U"]
    return options


def host_volumes(
    pod_spec: dict[str, Any], name: str, root: Path, files: dict[str, str]
) -> list[str]:
    """`--volume` options for container `name`'s mounts that are not emptyDirs, each a host
    directory under ``root``: a ConfigMap volume's items written from ``files`` (item key ->
    text; as kubelet projects them), any other volume (a model's PVC or host path) empty."""
    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    options = []
    for path, volume in other_volumes(pod_spec, name).items():
        host = root / volume
        host.mkdir(parents=True, exist_ok=True)
        for item in volumes[volume].get("configMap", {}).get("items", []):
            (host / item["path"]).write_text(files[item["key"]])
        options.append(f"--volume={host}:{path}:ro")
    return options


def other_volumes(pod_spec: dict[str, Any], name: str) -> dict[str, str]:
    """mountPath -> volume name of container `name`'s mounts that are not emptyDirs: what a
    test must provide itself (a ConfigMap's files, a model directory)."""
    volumes = {v["name"]: v for v in pod_spec.get("volumes", [])}
    return {
        m["mountPath"]: m["name"]
        for m in container(pod_spec, name).get("volumeMounts", [])
        if "emptyDir" not in volumes[m["name"]]
    }
