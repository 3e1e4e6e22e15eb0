"""Probe attempts file their reports in the real API; `dsv4ctl rollout` reads and steers them."""

from __future__ import annotations

import asyncio
import json

import pytest
from kubernetes import config

from dsv4_dev.cluster.local import LocalCluster
from dsv4_engine.probe import ProbeSettings
from dsv4_engine.probe.scripted_server import ScriptedCompletionServer
from dsv4_operator.api.crd import CRD_PATH
from dsv4_operator.api.rollout import RolloutVerdict
from dsv4_operator.api.samples import load_sample
from dsv4_operator.cli.main import main
from dsv4_operator.kube.client import Kube
from dsv4_operator.render.meta import Owner
from dsv4_operator.rollout import manual
from dsv4_operator.rollout.decide import ManualAction
from dsv4_operator.rollout.executor import LocalProbeExecutor
from dsv4_operator.rollout.reports import ReportRef, outcome_from_config_map
from tests.e2e.helpers import get_json

NS = "rollout-controls"


@pytest.fixture(scope="module")
def deployment(cluster: LocalCluster) -> Owner:
    cluster.kubectl("apply", "--server-side", "-f", str(CRD_PATH))
    cluster.wait_established("crd/dsv4deployments.inference.dsv4.dev")
    cluster.kubectl("create", "namespace", NS, check=False)
    sample = load_sample()
    sample["metadata"] = {"name": "flash", "namespace": NS}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(sample))
    uid = get_json(cluster, "dsv4", "flash", "-n", NS)["metadata"]["uid"]
    return Owner(name="flash", namespace=NS, uid=uid)


def run_attempt(cluster: LocalCluster, owner: Owner, report: str, server_kwargs: dict | None):
    """One local probe attempt filing `flash-canary-<revision>-<attempt>`."""
    kube = Kube(config.new_client_from_config(config_file=cluster.kubeconfig))
    revision, attempt = report.removeprefix("flash-canary-").rsplit("-", 1)
    ref = ReportRef("canary", revision, attempt=int(attempt))
    assert ref.name(owner) == report

    async def go() -> None:
        executor = LocalProbeExecutor(kube, asyncio.get_running_loop())
        if server_kwargs is None:
            url = "http://127.0.0.1:9"  # discard port: nothing listens
            # How long the warm-up waits by default is test_probe_runner's; here, the verdict.
            await executor.run(owner, ref, ProbeSettings(base_url=url, warm_up_s=2.0))
            return
        server = ScriptedCompletionServer(**server_kwargs)
        url = await server.start()
        try:
            settings = ProbeSettings(
                base_url=url, backend="reference", concurrency=8, requests=200, seed=3
            )
            await executor.run(owner, ref, settings)
        finally:
            await server.stop()

    asyncio.run(go())
    return outcome_from_config_map(get_json(cluster, "configmap", report, "-n", NS))


def test_failing_canary_files_a_fail_report_owned_by_the_deployment(cluster, deployment):
    outcome = run_attempt(
        cluster, deployment, "flash-canary-abc-1", {"corruption_rate": 0.2, "seed": 5}
    )
    assert outcome is not None and outcome.verdict is RolloutVerdict.FAIL
    assert outcome.rate is not None and outcome.rate > 0.05
    cm = get_json(cluster, "configmap", "flash-canary-abc-1", "-n", NS)
    assert cm["metadata"]["ownerReferences"][0]["uid"] == deployment.uid
    report = json.loads(cm["data"]["report.json"])
    assert report["verdict"] == "FAIL"


def test_unreachable_canary_is_inconclusive_never_pass(cluster, deployment):
    outcome = run_attempt(cluster, deployment, "flash-canary-abc-2", None)
    assert outcome is not None and outcome.verdict is RolloutVerdict.INCONCLUSIVE
    assert "unreachable" in outcome.message


def test_rollout_cli_shows_status_prints_report_and_sets_controls(cluster, deployment, capsys):
    run_attempt(cluster, deployment, "flash-canary-abc-3", {"corruption_rate": 0.2, "seed": 6})
    status = {
        "status": {
            "rollout": {
                "phase": "RolledBack",
                "stableRevision": "aaaa",
                "canaryRevision": "abc",
                "verdict": "FAIL",
                "rate": 0.2,
                "bound": 0.35,
                "samples": 30,
                "report": "flash-canary-abc-3",
                "rejectedRevision": "abc",
            }
        }
    }
    cluster.kubectl(
        "patch", "dsv4", "flash", "-n", NS, "--subresource=status", "--type=merge",
        "-p", json.dumps(status),
    )  # fmt: skip
    common = ["-n", NS, "--kubeconfig", cluster.kubeconfig]
    assert main(["rollout", "status", "flash", *common]) == 0
    out = capsys.readouterr().out
    assert "RolledBack" in out and "20.000%" in out and "flash-canary-abc-3" in out
    assert main(["rollout", "report", "flash", *common]) == 0
    out = capsys.readouterr().out
    assert "FAIL" in out and "flash-canary-abc-3" in out
    assert main(["rollout", "report", "flash", *common, "--output", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "FAIL"

    assert main(["rollout", "retry", "flash", *common]) == 0
    annotations = get_json(cluster, "dsv4", "flash", "-n", NS)["metadata"]["annotations"]
    request = manual.parse(annotations)
    assert request is not None and request.action is ManualAction.RETRY and request.token
    assert request.revision == "abc"  # bound to the rejected flags it retries
    # Nothing is in progress: an abort is refused before anything is written.
    assert main(["rollout", "abort", "flash", *common]) == 1
    assert "nothing to abort" in capsys.readouterr().err
    after = manual.parse(get_json(cluster, "dsv4", "flash", "-n", NS)["metadata"]["annotations"])
    assert after == request


def test_rollout_cli_on_a_missing_deployment_is_one_line(cluster, capsys):
    code = main(["rollout", "status", "nope", "-n", NS, "--kubeconfig", cluster.kubeconfig])
    assert code == 1
    assert (
        capsys.readouterr().err.strip()
        == f"dsv4ctl rollout: error: DSV4Deployment {NS}/nope not found"
    )
