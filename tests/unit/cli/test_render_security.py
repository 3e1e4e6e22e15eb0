"""What a security reviewer reads in `dsv4ctl render`: every pod the operator creates runs
non-root as its image's user, under RuntimeDefault seccomp, without privilege escalation,
with every capability dropped (IPC_LOCK back only for RDMA roles), and only the router —
the one pod that calls the API — carries a token, of its own ServiceAccount, bound to the
shipped ClusterRole alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes.utils import parse_quantity

from dsv4_operator.api.samples import SHIPPED_DIR
from dsv4_operator.cli.main import main
from dsv4_operator.render.router import ROUTER_CLUSTER_ROLE
from dsv4_operator.render.security import ENGINE_HOME, EPHEMERAL_STORAGE, IMAGE_UID, Scratch
from dsv4_operator.render.workloads import ENGINE_SCRATCH, SHM_SIZE

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = sorted(p for p in SHIPPED_DIR.glob("*-*.yaml"))
WORKLOADS = ("StatefulSet", "Deployment", "Job")
LWS_TEMPLATES = ("leaderTemplate", "workerTemplate")
POD_CONTEXT = {
    "runAsNonRoot": True,
    "runAsUser": IMAGE_UID,
    "runAsGroup": IMAGE_UID,
    "seccompProfile": {"type": "RuntimeDefault"},
}
HOST_ACCESS = ("hostNetwork", "hostPID", "hostIPC")


def rendered(capsys, path, *extra):
    assert main(["render", str(path), *extra]) == 0
    return [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]


def pods(objects):
    """(workload, pod spec) of every workload rendered, both templates of a LeaderWorkerSet."""
    out = [(o, o["spec"]["template"]["spec"]) for o in objects if o["kind"] in WORKLOADS]
    for o in objects:
        if o["kind"] == "LeaderWorkerSet":
            group = o["spec"]["leaderWorkerTemplate"]
            out += [(o, group[t]["spec"]) for t in LWS_TEMPLATES]
    return out


def component(workload):
    return workload["metadata"]["labels"]["app.kubernetes.io/component"]


def image_user(image):
    dockerfile = (ROOT / "images" / image / "Dockerfile").read_text()
    users = [line.split()[1] for line in dockerfile.splitlines() if line.startswith("USER ")]
    return tuple(int(part) for part in users[-1].split(":"))


def test_every_pod_runs_as_the_images_own_non_root_user():
    """The engine image (engines, routers) and the operator image (probe Jobs) both."""
    assert image_user("engine") == image_user("operator") == (IMAGE_UID, IMAGE_UID)


def test_the_engine_scratch_is_where_the_engine_image_keeps_its_jit_caches():
    """HOME of images/engine/Dockerfile: writable under the read-only root."""
    dockerfile = (ROOT / "images" / "engine" / "Dockerfile").read_text()
    assert f"HOME={ENGINE_HOME}" in dockerfile
    assert ENGINE_HOME in ENGINE_SCRATCH.paths


@pytest.mark.parametrize("sample", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_every_rendered_pod_is_hardened(capsys, sample):
    objects = rendered(capsys, sample, "--canary", "indexDtype=fp4", "--probe-job")
    spec = yaml.safe_load(sample.read_text())["spec"]
    found = set()
    for workload, pod in pods(objects):
        found.add(component(workload))
        assert pod["securityContext"] == POD_CONTEXT, workload["metadata"]["name"]
        assert not any(pod.get(key) for key in HOST_ACCESS)
        (container,) = pod["containers"]
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["runAsNonRoot"] is True
        assert "privileged" not in context
        assert context["capabilities"]["drop"] == ["ALL"]
        assert context["readOnlyRootFilesystem"] is True
        # What it writes goes to a bounded scratch, counted in its ephemeral storage.
        (scratch,) = [v for v in pod["volumes"] if v["name"] == Scratch.NAME]
        limit = container["resources"]["limits"][EPHEMERAL_STORAGE]
        assert (
            container["resources"]["requests"][EPHEMERAL_STORAGE]
            == scratch["emptyDir"]["sizeLimit"]
        )
        assert parse_quantity(limit) > parse_quantity(scratch["emptyDir"]["sizeLimit"])
        assert "/tmp" in {m["mountPath"] for m in container["volumeMounts"]}
        assert {"cpu", "memory"} <= container["resources"]["requests"].keys()
        assert {"cpu", "memory"} <= container["resources"]["limits"].keys()
        shm = [v for v in pod["volumes"] if v["name"] == "shm"]
        assert all(v["emptyDir"]["sizeLimit"] == SHM_SIZE for v in shm)
        added = context["capabilities"].get("add", [])
        role = component(workload)
        if role in ("prefill", "decode") and spec[role].get("resources", {}).get("rdma"):
            assert added == ["IPC_LOCK"]  # RDMA memory registration pins memory
        else:
            assert added == [], workload["metadata"]["name"]
    assert found == {"prefill", "decode", "router", "probe"}


def test_the_flash_sample_engine_pods_mount_no_token(capsys):
    objects = rendered(capsys, SHIPPED_DIR / "flash-b200-1p1d.yaml")
    engines = [(w, p) for w, p in pods(objects) if component(w) in ("prefill", "decode")]
    assert len(engines) == 2
    for _, pod in engines:
        assert pod["automountServiceAccountToken"] is False
        assert "serviceAccountName" not in pod  # no grants: the namespace's default, no token
        assert not [v for v in pod["volumes"] if "projected" in v]  # no token by hand either


def test_only_the_router_gets_a_token_and_only_its_shipped_grant(capsys):
    objects = rendered(capsys, SHIPPED_DIR / "flash-b200-1p1d.yaml")
    (router,) = [p for w, p in pods(objects) if component(w) == "router"]
    assert router["automountServiceAccountToken"] is True
    assert router["serviceAccountName"] == "flash-router"
    assert not [o for o in objects if o["kind"] == "Role"]  # no rules written for routers
    (binding,) = [o for o in objects if o["kind"] == "RoleBinding"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": ROUTER_CLUSTER_ROLE,
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "flash-router", "namespace": "default"}
    ]


def test_the_model_pvc_is_mounted_read_only(capsys):
    objects = rendered(capsys, SHIPPED_DIR / "flash-b200-1p1d.yaml")
    for workload, pod in pods(objects):
        if component(workload) not in ("prefill", "decode"):
            continue
        (model,) = [v for v in pod["volumes"] if v["name"] == "model"]
        assert model["persistentVolumeClaim"]["readOnly"] is True
        (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "model"]
        assert mount["readOnly"] is True
