"""`--probe-mode local`, the development shortcut: the operator probes the canary from its own
process (no Job, no probe pod, no probe account), through the local runtime's endpoint
map, and files the same report.  A fault-injected flag change FAILs and is rolled back,
and no probe Job ever exists."""

from __future__ import annotations

import json

import pytest

from dsv4_dev.cluster.local import LocalCluster
from dsv4_operator.api.rollout import RolloutVerdict
from dsv4_operator.render.meta import LABEL_COMPONENT, PROBE_COMPONENT
from dsv4_operator.rollout.reports import outcome_from_config_map
from tests.e2e.helpers import get_json, operator_and_runtime, wait_for
from tests.e2e.test_probe_jobs import RACE, VERDICT_TIMEOUT, create_deployment

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NS = "probe-local-mode"


def rollout(cluster: LocalCluster) -> dict:
    status = get_json(cluster, "dsv4", "flash", "-n", NS).get("status") or {}
    return status.get("rollout") or {}


def test_local_mode_probes_in_process_and_its_fail_rolls_back(cluster, tmp_path):
    operator, runtime = operator_and_runtime(cluster, NS, tmp_path, "--probe-mode", "local")
    create_deployment(cluster, NS)
    operator.start()
    runtime.start()
    try:
        wait_for(
            "deployment Ready",
            lambda: (
                (get_json(cluster, "dsv4", "flash", "-n", NS).get("status") or {}).get("phase")
                == "Ready"
            ),
            180,
        )
        cluster.kubectl(
            "patch", "dsv4", "flash", "-n", NS, "--type=merge",
            "-p", json.dumps({"spec": {"features": RACE}}),
        )  # fmt: skip
        done = wait_for(
            "rolled back",
            lambda: (r := rollout(cluster)).get("phase") == "RolledBack" and r,
            VERDICT_TIMEOUT,
        )
        assert done["verdict"] == "FAIL", done
        filed = get_json(cluster, "configmap", done["report"], "-n", NS)
        outcome = outcome_from_config_map(filed)
        assert outcome is not None and outcome.verdict is RolloutVerdict.FAIL
        selector = f"{LABEL_COMPONENT}={PROBE_COMPONENT}"
        assert get_json(cluster, "jobs", "-n", NS, "-l", selector)["items"] == []
        assert "Traceback" not in operator.text()
    finally:
        cluster.kubectl("delete", "dsv4", "flash", "-n", NS, "--wait=false", check=False)
        operator.stop()
        runtime.stop()
