"""`dsv4ctl rollout promote|abort|retry`: the request the operator acts on."""

import pytest

from dsv4_operator.cli import rollout as rollout_cli
from dsv4_operator.cli.main import main
from dsv4_operator.rollout.decide import ManualAction
from dsv4_operator.rollout.manual import parse


class PatchRecordingKube:
    def __init__(self, rollout):
        self.requests = []
        self.rollout = rollout

    def get(self, kind, namespace, name):
        return {
            "metadata": {"name": name, "namespace": namespace},
            "status": {"rollout": self.rollout},
        }

    def request(self, method, url_path, body=None, content_type="application/json", query=None):
        self.requests.append((method, url_path, body, content_type))


PROBING = {"phase": "Probing", "canaryRevision": "c0ffee1234", "stableRevision": "aaaa"}
ROLLED_BACK = {
    "phase": "RolledBack",
    "canaryRevision": "c0ffee1234",
    "rejectedRevision": "c0ffee1234",
}


@pytest.mark.parametrize(
    ("action", "rollout"), [("promote", PROBING), ("abort", PROBING), ("retry", ROLLED_BACK)]
)
def test_a_control_is_a_merge_patch_of_the_annotation_the_operator_reads(
    action, rollout, monkeypatch, capsys
):
    kube = PatchRecordingKube(rollout)
    monkeypatch.setattr(rollout_cli, "connect", lambda kubeconfig: kube)
    assert main(["rollout", action, "flash", "-n", "serving"]) == 0
    ((method, url, body, content_type),) = kube.requests
    assert (method, content_type) == ("PATCH", "application/merge-patch+json")
    assert url == "/apis/inference.dsv4.dev/v1alpha1/namespaces/serving/dsv4deployments/flash"
    manual = parse(body["metadata"]["annotations"])
    assert manual is not None and manual.action is ManualAction(action) and manual.token
    # Bound to the flags the status shows: a control cannot act on a later rollout.
    assert manual.revision == "c0ffee1234"
    assert capsys.readouterr().out == f"serving/flash: {action} of flags c0ffee1234 requested\n"


@pytest.mark.parametrize(
    ("action", "rollout", "why"),
    [
        ("promote", {"phase": "Idle"}, "nothing to promote: no rollout in progress (phase Idle)"),
        ("abort", {"phase": "RolledBack"}, "nothing to abort: no rollout in progress"),
        ("retry", PROBING, "nothing to retry: no flags are rejected"),
    ],
)
def test_a_control_with_nothing_to_act_on_is_refused_before_any_write(
    action, rollout, why, monkeypatch, capsys
):
    kube = PatchRecordingKube(rollout)
    monkeypatch.setattr(rollout_cli, "connect", lambda kubeconfig: kube)
    assert main(["rollout", action, "flash", "-n", "serving"]) == 1
    assert kube.requests == []
    assert why in capsys.readouterr().err
