"""`dsv4ctl rollout promote|abort|retry`: the request the operator acts on."""

import pytest

from dsv4_operator.cli import rollout as rollout_cli
from dsv4_operator.cli.main import main
from dsv4_operator.rollout.decide import ManualAction
from dsv4_operator.rollout.manual import parse


class PatchRecordingKube:
    def __init__(self):
        self.requests = []

    def get(self, kind, namespace, name):
        return {"metadata": {"name": name, "namespace": namespace}, "status": {}}

    def request(self, method, url_path, body=None, content_type="application/json", query=None):
        self.requests.append((method, url_path, body, content_type))


@pytest.mark.parametrize("action", ["promote", "abort", "retry"])
def test_a_control_is_a_merge_patch_of_the_annotation_the_operator_reads(
    action, monkeypatch, capsys
):
    kube = PatchRecordingKube()
    monkeypatch.setattr(rollout_cli, "connect", lambda kubeconfig: kube)
    assert main(["rollout", action, "flash", "-n", "serving"]) == 0
    ((method, url, body, content_type),) = kube.requests
    assert (method, content_type) == ("PATCH", "application/merge-patch+json")
    assert url == "/apis/inference.dsv4.dev/v1alpha1/namespaces/serving/dsv4deployments/flash"
    manual = parse(body["metadata"]["annotations"])
    assert manual is not None and manual.action is ManualAction(action) and manual.token
    assert capsys.readouterr().out == f"serving/flash: {action} requested\n"
