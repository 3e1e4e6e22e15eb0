"""What the local runtime changes of a probe Job's pod, and what it reports of its exit:
only Service URLs become their published loopback URLs; the exit is kubelet's."""

from __future__ import annotations

from dsv4_dev.localrun import endpoints
from dsv4_dev.localrun.probes import exit_code, exit_status, local_args
from dsv4_engine.probe import ProbeSettings
from dsv4_engine.probe.args import probe_args

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
