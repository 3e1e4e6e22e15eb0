"""Capacity is not a verdict, end to end: real control plane and scheduler, the operator
process, the local runtime running the reference engine for every engine pod, real probes.

The shipped reference sample is pinned (`spec.placement.nodeSelector`) to a pool of its own,
one fake B200 node of 8 GPUs: its prefill and decode (4 GPUs each) fill it, so the cluster
holds no spare GPU for a canary.  An engine change (the tool-call parser) then finds no
room: the canary waits in CanaryPending with the scheduler's words, ends NoCapacity at its
placement timeout without rejecting the flags, and once a node joins the pool it starts
again, PASSes and is promoted.
What is tested is where the canary runs, not the evidence it gathers (test_rollout.py runs
the default 598 samples): its canary judges against a 5% budget (59 samples), as
test_engine_revision.py's do, set in the spec as a user would.
"""

from __future__ import annotations

import json
import time

import pytest

from dsv4_dev.cluster.local import LocalCluster
from dsv4_dev.cluster.nodes import NodePool, node_manifest
from tests.e2e.helpers import get_json, serving_reference_sample, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NS = "capacity-e2e"
NAME = "flash"
POOL = "e2e.dsv4.dev/pool"
TIGHT = NodePool(
    prefix="tight-b200", count=2, cpus=224, memory="2Ti", gpus=8, gpu_product="NVIDIA-B200"
)
# An engine change that needs no more than GPUs (HiCache would add its host tier to the
# pods' memory, and a PASS with it needs more samples read back from that tier than a 5%
# budget's 59 hold).
CHANGE = {"model": {"toolCallParser": "deepseekv32"}}
PLACEMENT = {"placement": {"gpuProducts": ["NVIDIA-B200"], "nodeSelector": {POOL: "tight"}}}
BUDGET = {"canary": {"maxCorruptionRate": 0.05, "concurrency": 16}}
VERDICT_TIMEOUT = 900  # spec.canary.probeTimeoutSeconds, the default


def add_node(cluster: LocalCluster, index: int) -> None:
    node = node_manifest(TIGHT, index)
    node["metadata"]["labels"][POOL] = "tight"
    cluster.apply_retrying(json.dumps(node))


@pytest.fixture(scope="module")
def world(cluster: LocalCluster, tmp_path_factory):
    add_node(cluster, 0)
    try:
        logs = tmp_path_factory.mktemp("capacity")
        with serving_reference_sample(cluster, NS, logs, {**PLACEMENT, **BUDGET}):
            yield cluster
    finally:
        for index in range(TIGHT.count):
            name = f"{TIGHT.prefix}-{index}"
            cluster.kubectl("delete", "node", name, "--wait=false", check=False)


def rollout(cluster: LocalCluster) -> dict:
    return (get_json(cluster, "dsv4", NAME, "-n", NS).get("status") or {}).get("rollout") or {}


def test_a_canary_with_no_room_ends_no_capacity_unrejected_and_passes_once_a_node_joins(world):
    cluster = world
    stable = rollout(cluster)["stableRevision"]
    started = time.monotonic()
    body = json.dumps({"spec": CHANGE})
    cluster.kubectl("patch", "dsv4", NAME, "-n", NS, "--type=merge", "-p", body)
    pending = wait_for(
        "CanaryPending with the scheduler's words",
        lambda: (r := rollout(cluster)).get("phase") == "CanaryPending" and r,
        120,
    )
    assert "the canary cannot be placed: " in pending["message"], pending
    assert "Insufficient nvidia.com/gpu" in pending["message"], pending["message"]
    done = wait_for(
        "NoCapacity",
        lambda: (r := rollout(cluster)).get("verdict") == "NoCapacity" and r,
        120,
    )
    took = time.monotonic() - started
    assert done["phase"] == "CanaryPending" and "rejectedRevision" not in done, done
    assert "not rejected: tried again when a GPU node is added" in done["message"]
    ledger = cluster.kubectl("get", "configmap", f"{NAME}-revisions", "-n", NS, check=False)
    assert ledger.returncode != 0, "capacity rejects nothing: no ledger of rejections"
    wait_for(
        "the canary slice given back",
        lambda: not get_json(cluster, "statefulset", "-n", NS, "-l",
                             f"app.kubernetes.io/instance={NAME}--canary")["items"],
        60,
    )  # fmt: skip
    phase = get_json(cluster, "dsv4", NAME, "-n", NS)["status"]["phase"]
    assert phase != "Degraded", "waiting for capacity is progress, not a failure"
    print(f"\n[capacity e2e] NoCapacity {took:.0f} s after the flag change")
    joined = time.monotonic()
    add_node(cluster, 1)
    promoted = wait_for(
        "a verdict and its promotion once the node joined",
        lambda: (
            (
                (r := rollout(cluster)).get("phase") == "RolledBack"
                or (r.get("phase") == "Idle" and r.get("stableRevision") != stable)
            )
            and r
        ),
        VERDICT_TIMEOUT,
    )
    assert promoted["phase"] == "Idle" and promoted["verdict"] == "PASS", promoted
    assert promoted["stableRevision"] == done["canaryRevision"]
    print(f"[capacity e2e] node joined -> PASS -> promoted: {time.monotonic() - joined:.0f} s")
