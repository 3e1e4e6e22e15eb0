"""What the local runtime changes of a probe Job's pod, and what it reports of its exit:
only Service URLs become their published loopback URLs; the exit is kubelet's; a pod run
from a local image runs under the Job's own security settings."""

from __future__ import annotations

import json

import pytest

from dsv4_dev import images
from dsv4_dev.localrun import endpoints
from dsv4_dev.localrun.probes import exit_code, exit_status, local_args, parse_image_map
from dsv4_engine.probe import ProbeSettings
from dsv4_engine.probe.args import probe_args
from dsv4_operator.render.meta import Owner
from dsv4_operator.rollout.probe_job import probe_job
from dsv4_operator.rollout.reports import ReportRef, report_skeleton

PUBLISHED = {endpoints.key("flash--canary-router", "serving", 8000): "http://127.0.0.1:41234"}


def test_only_a_published_service_url_changes():
    settings = ProbeSettings(
        base_url="http://flash--canary-router.serving.svc:8000", backend="reference"
    )
    rendered = ["probe", *probe_args(settings), "--report-configmap", "r"]
    local = local_args(rendered, PUBLISHED)
    changed = [(a, b) for a, b in zip(rendered, local, strict=True) if a != b]
    assert changed == [("http://flash--canary-router.serving.svc:8000", "http://127.0.0.1:41234")]


def test_service_url_forms_a_resolver_accepts():
    long = "http://flash--canary-router.serving.svc.cluster.local:8000/v1"
    assert local_args([long], PUBLISHED) == ["http://127.0.0.1:41234/v1"]
    # Unpublished (another port, namespace or no endpoint yet): left to fail as it would.
    unpublished = [
        "http://flash--canary-router.serving.svc:9000",
        "http://flash--canary-router.other.svc:8000",
        "http://flash-router.serving.svc:8000",
    ]
    assert local_args(unpublished, PUBLISHED) == unpublished


def test_the_exit_reported_is_kubelets():
    assert exit_code(0) == 0 and exit_code(2) == 2
    assert exit_code(-15) == 143 and exit_code(-9) == 137  # killed by a signal
    passed = exit_status("probe", "op:1", 0, "t0", "t1")["status"]
    assert passed["phase"] == "Succeeded"
    (container,) = passed["containerStatuses"]
    assert container["state"]["terminated"] == {
        "exitCode": 0, "reason": "Completed", "startedAt": "t0", "finishedAt": "t1",
    }  # fmt: skip
    failed = exit_status("probe", "op:1", 1, "t0", "t1")["status"]
    assert failed["phase"] == "Failed"
    assert failed["containerStatuses"][0]["state"]["terminated"]["reason"] == "Error"
    assert failed["containerStatuses"][0]["name"] == "probe"  # what podFailurePolicy matches


def rendered_probe_pod() -> dict:
    """The pod spec of a probe Job as the operator renders it."""
    owner = Owner(name="flash", namespace="serving", uid="u-1")
    ref = ReportRef("canary", "r1", attempt=1)
    settings = ProbeSettings(
        base_url="http://flash--canary-router.serving.svc:8000", backend="reference"
    )
    report = report_skeleton(owner, ref)
    report["metadata"]["uid"] = "r-1"  # as the API server gives it
    job = probe_job(owner, report, "canary", settings, "ghcr.io/dsv4/op:1")
    return job["spec"]["template"]["spec"]


def test_a_probe_pod_from_an_image_runs_as_the_pod_says(tmp_path):
    spec = rendered_probe_pod()
    (container,) = spec["containers"]
    kubeconfig = tmp_path / "kubeconfig"
    command = images.run_as_pod(
        spec, container["name"], "localhost/op:dev", "probe-1", kubeconfig, ["probe", "local"]
    )
    assert command[:4] == ["podman", "run", "--rm", "--name=probe-1"]
    # The Job's user, read-only root with its scratch emptyDir, no capability, no escalation.
    user = command.index("--user")
    assert command[user : user + 2] == ["--user", "10001:10001"]
    assert {"--read-only", "--cap-drop=ALL", "no-new-privileges"} <= set(command)
    scratch = {m["mountPath"] for m in container["volumeMounts"]}
    assert {command[i + 1].split(":")[0] for i, a in enumerate(command) if a == "--tmpfs"} == (
        scratch
    )
    # Its credential where $KUBECONFIG says, read-only; its command, then the args given.
    assert f"--volume={kubeconfig}:{images.CONTAINER_KUBECONFIG}:ro" in command
    assert f"--env=KUBECONFIG={images.CONTAINER_KUBECONFIG}" in command
    at = command.index("localhost/op:dev")
    assert command[at - 2 : at] == ["--entrypoint", json.dumps(container["command"])]
    assert command[at + 1 :] == ["probe", "local"]
    assert images.run_as_user(spec, container["name"]) == 10001


def test_the_image_map_is_pairs_and_a_bad_entry_is_named():
    assert parse_image_map("") == {}
    assert parse_image_map("ghcr.io/dsv4/operator:0.1.0=localhost/op:dev, a:1=b:2") == {
        "ghcr.io/dsv4/operator:0.1.0": "localhost/op:dev",
        "a:1": "b:2",
    }
    with pytest.raises(ValueError, match=r"'localhost/op:dev' is not `pod image=local image`"):
        parse_image_map("localhost/op:dev")
    with pytest.raises(ValueError, match=r"'a=' is not"):
        parse_image_map("a=")
