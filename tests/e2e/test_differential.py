"""Differential consistency on the production path: a probe Job, the operator's own
baseline, engines that are not deterministic.

The shipped reference sample runs with `faultInjection.benignNondeterminism` (its random
model flips a share of prefix-cache hits, as healthy SGLang flips near-ties), so its
`GET /server_info` says it is not deterministic and a canary's consistency samples can
only be judged against the stable's own divergence.  A raced canary (HiCache, bf16 index-K,
the gate removed) must FAIL on that excess, its probe Job having reached the stable router
the operator named as the baseline.  How often the race garbles follows the machine's
timing (copy vs compute; a loaded machine lets more copies land first), so the FAIL may
come from the excess or from the kv-canary the canary's engines run, whichever shows
first; what this test holds on the production path is that the Job measured both sides.
That the excess alone FAILs a raced canary and a gated one PASSes against the same noise is
tests/integration/test_reference_differential.py's, on a slowed host link.
"""

from __future__ import annotations

import json

import pytest

from dsv4_dev.cluster.local import LocalCluster
from tests.e2e.helpers import get_json, serving_reference_sample, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NS = "differential-e2e"
NAME = "flash"
NOISE = {"benignNondeterminism": 0.03}
# What this module tests is the wiring, not the evidence the default canary demands
# (test_rollout.py's): a 5% budget, whose fewest samples that can PASS are 59, 16 in flight,
# and a device pool that 59 samples' prompts overflow within their first few rounds (the
# default's would hardly be overflowed by so few, and the race is on the host-tier path).
STABLE = {
    "features": {"indexDtype": "fp8", "kvCanary": "log", "faultInjection": NOISE},
    "canary": {"maxCorruptionRate": 0.05, "concurrency": 16, "devicePoolTokens": 4096},
}
VERDICT_TIMEOUT = 600


@pytest.fixture(scope="module")
def world(cluster: LocalCluster, tmp_path_factory):
    with serving_reference_sample(cluster, NS, tmp_path_factory.mktemp("differential"), STABLE):
        yield cluster


def rollout(cluster: LocalCluster) -> dict:
    return (get_json(cluster, "dsv4", NAME, "-n", NS).get("status") or {}).get("rollout") or {}


def test_a_raced_canary_fails_on_its_excess_over_the_stables_noise(world):
    cluster = world
    raced = {
        "hicache": {"enabled": True, "ratio": 2.0},
        "indexDtype": "bf16",
        "faultInjection": {**NOISE, "ungatedIndexK": True},
    }
    cluster.kubectl(
        "patch", "dsv4", NAME, "-n", NS, "--type=merge",
        "-p", json.dumps({"spec": {"features": raced}}),
    )  # fmt: skip
    done = wait_for(
        "the canary's verdict",
        lambda: (r := rollout(cluster)).get("phase") == "RolledBack" and r,
        VERDICT_TIMEOUT,
    )
    assert done["verdict"] == "FAIL", done
    data = get_json(cluster, "configmap", done["report"], "-n", NS)["data"]
    report = json.loads(data["report.json"])
    diff = report["differential"]
    # The Job was given a baseline beside the canary (the stable router's Service, which
    # the local runtime resolves for the pod it plays), and the baseline answered.
    assert diff["baseline_url"] == report["settings"]["baseline_url"]
    assert diff["baseline_url"] != report["settings"]["base_url"]
    assert diff["stable"]["samples"] > 0 and diff["canary"]["samples"] > 0
    # A FAIL on the excess says so; otherwise the engines' kv-canary caught the race first.
    on_excess = any("diverge more than the stable's" in r for r in report["reasons"])
    assert on_excess is (diff["fail_at"] is not None), (report["reasons"], diff)
    assert on_excess or report["kv_canary"]["violations"], report["reasons"]
    # A changed warm answer on such an engine is never counted as corruption by itself.
    assert report["counts"]["CACHE_MISMATCH"] == 0 and report["samples"]["judged"] == 0
