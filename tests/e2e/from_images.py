"""The shipped install run from the project's images on the local cluster: what
test_operator_image.py and test_engine_image.py share.

The operator image (hack/images.sh) runs under podman with the installed Deployment's own
args, user, read-only root filesystem, /tmp emptyDir and capabilities, and nothing but its
ServiceAccount's token (`installed_operator(image=...)`).  The install is the shipped one
(manifests/base), its settings given the sample's model directory as a platform team
would.  The local runtime runs each probe Job pod from the image the operator put in the
Job — the operator pod's own — mapped to the local build (`$DSV4_LOCALRUN_IMAGES`), under
the Job's own security settings; and, given the CPU engine image, each engine pod from it.

The canary runs the shipped defaults (`spec.canary` unset: 598 clean samples at most 0.5%
corrupt, 95% confidence, 64 in flight), as a user who applies the sample gets it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dsv4_dev import images
from dsv4_dev.cluster.local import LocalCluster
from dsv4_operator.api.samples import shipped_sample
from dsv4_operator.render.meta import LABEL_COMPONENT, LABEL_INSTANCE
from dsv4_operator.rollout.probe_job import COMPONENT
from tests.e2e.escapes import SERVED
from tests.e2e.helpers import (
    MANIFESTS,
    Installed,
    audit_events,
    get_json,
    installed_operator,
    local_runtime,
    wait_for,
)
from tests.unit.operator.harness import MODEL_HOST_PATHS

NAME = "flash"
SAMPLE = "flash-reference"
HICACHE_BF16 = {"hicache": {"enabled": True, "ratio": 2.0}, "indexDtype": "bf16"}
VERDICT_TIMEOUT = 900  # spec.canary.probeTimeoutSeconds, the default
# What the API server records of a token it bound to a pod: the pod's name.
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"


def operator_image_name(installed: Installed) -> str:
    """The image the installed Deployment's pod runs: the one its probe Jobs get."""
    deployment = next(o for o in installed.objects if o["kind"] == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container["image"]


@contextlib.contextmanager
def from_images(
    cluster: LocalCluster, namespace: str, workdir: Path, engine_image: str | None = None
) -> Iterator[tuple[Installed, str]]:
    """The operator installed and running from its image, the local runtime running probe
    pods from it (and engine pods from ``engine_image``), ``namespace`` served; yields the
    install and the operator image's local name.  On the way out the sample is deleted and
    the namespace with it (the fake nodes' GPUs go back to the modules after)."""
    image = images.build("operator")
    cluster.kubectl("create", "namespace", namespace)
    cluster.kubectl("label", "namespace", namespace, f"{SERVED}=true")
    settings = {"allowedModelHostPaths": ",".join(MODEL_HOST_PATHS)}
    runtime = None
    try:
        with installed_operator(
            cluster, MANIFESTS / "base", workdir, image=image, settings=settings
        ) as installed:
            mapped = {operator_image_name(installed): image}
            if engine_image is not None:
                mapped[shipped_sample(SAMPLE)["spec"]["image"]["name"]] = engine_image
            runtime = local_runtime(cluster, workdir, mapped)
            runtime.start()
            yield installed, image
    finally:
        cluster.kubectl("delete", "dsv4", NAME, "-n", namespace, "--wait=false", check=False)
        if runtime is not None:
            runtime.stop()
        cluster.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=120s")


def status(cluster: LocalCluster, namespace: str) -> dict[str, Any]:
    return get_json(cluster, "dsv4", NAME, "-n", namespace).get("status") or {}


def apply_sample_until_ready(cluster: LocalCluster, installed: Installed, namespace: str) -> None:
    """The shipped reference sample, applied unchanged, Ready under the image's operator."""
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(shipped_sample(SAMPLE)))

    def ready() -> bool:
        assert installed.proc.poll() is None, (
            f"operator exited: {installed.log.read_text()[-3000:]}"
        )
        return status(cluster, namespace).get("phase") == "Ready"

    wait_for(f"sample {NAME} Ready, reconciled by the operator image", ready, timeout=300)


def pass_a_clean_flag_change(
    cluster: LocalCluster, installed: Installed, image: str, namespace: str
) -> dict[str, Any]:
    """HiCache with a bf16 index-K (gated), canaried: its probe Job runs from the operator
    image — this build of it — and files a PASS, and the change is promoted; returns the
    rollout status once the new revision is Ready."""
    assert status(cluster, namespace).get("phase") == "Ready", "the sample Ready first"
    before = status(cluster, namespace).get("rollout") or {}
    patch = {"spec": {"features": HICACHE_BF16}}
    cluster.kubectl("patch", "dsv4", NAME, "-n", namespace, "--type=merge", "-p", json.dumps(patch))
    started = wait_for(
        "a canary for the flag change",
        lambda: (
            (r := status(cluster, namespace).get("rollout") or {}).get("canaryRevision")
            not in (None, before.get("canaryRevision"))
            and r
        ),
        120,
    )
    done = wait_for(
        "the verdict",
        lambda: (
            (
                (r := status(cluster, namespace).get("rollout") or {}).get("phase") == "RolledBack"
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
    # The probe Job's pod ran the operator pod's own image, this build of it, and its
    # probe filed the PASS as the probe account.
    selector = f"{LABEL_COMPONENT}={COMPONENT}"
    (job,) = get_json(cluster, "jobs", "-n", namespace, "-l", selector)["items"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["image"] == operator_image_name(installed)
    (pod,) = get_json(
        cluster, "pods", "-n", namespace, "-l", f"job-name={job['metadata']['name']}"
    )["items"]
    (ran,) = pod["status"]["containerStatuses"]
    built = images.podman("image", "inspect", "--format", "{{.Id}}", image, check=True)
    assert ran["imageID"] == f"sha256:{built.stdout.strip()}"
    assert (pod["status"]["phase"], ran["state"]["terminated"]["exitCode"]) == ("Succeeded", 0)
    # The API server authenticated the verdict's write as the probe account, with the token
    # it bound to the Job's pod (what the report fence checks; never a field-manager name).
    writers = {
        (e["user"]["username"], tuple((e["user"].get("extra") or {}).get(POD_NAME_EXTRA, ())))
        for e in audit_events(cluster, installed.offset)
        if e.get("verb") == "patch"
        and e["objectRef"].get("resource") == "configmaps"
        and e["objectRef"].get("name") == done["report"]
        and e.get("responseStatus", {}).get("code") == 200
    }
    probe = (
        f"system:serviceaccount:{namespace}:{job['spec']['template']['spec']['serviceAccountName']}"
    )
    others = {w for w in writers if w[0] != "system:serviceaccount:dsv4-system:dsv4-operator"}
    assert others == {(probe, (pod["metadata"]["name"],))}, writers
    wait_for(
        "the new revision Ready", lambda: status(cluster, namespace).get("phase") == "Ready", 300
    )
    return done


def engine_pods(cluster: LocalCluster, namespace: str) -> list[dict[str, Any]]:
    """The deployment's engine pods that run (not terminating)."""
    pods = get_json(cluster, "pods", "-n", namespace, "-l", f"{LABEL_INSTANCE}={NAME}")["items"]
    return [
        p
        for p in pods
        if p["metadata"]["labels"].get(LABEL_COMPONENT) in ("prefill", "decode")
        and not p["metadata"].get("deletionTimestamp")
    ]
