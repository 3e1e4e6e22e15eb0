"""Every engine change goes through the canary, end to end: real control plane, real operator
process, the local runtime running the reference engine for every engine pod, real probes.

The shipped reference sample (manifests/samples/flash-reference.yaml) is applied and each
field the issue names is changed in turn — the tool-call parser, `extraArgs`, `env`, the
image, the transfer backend, speculative decoding — and each must start a canary, leave
production untouched while it is probed, and be promoted only on its PASS, in prefill+decode
pairs in the other slot (a surge, the default, whether the transfer key moves or not).

What this module tests is *what starts a canary and how it is promoted*, six times over; the
evidence the default canary demands (598 samples) is tested in test_rollout.py and the
README tour.  So its canaries judge against a 5% budget (the fewest samples that can PASS
it, 59, 16 in flight), which the spec sets as a user would (`spec.canary`).
"""

from __future__ import annotations

import json

import pytest

from dsv4_dev.cluster.local import LocalCluster
from tests.e2e.helpers import get_json, serving_reference_sample, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NS = "revision-e2e"
NAME = "flash"
BUDGET = {"canary": {"maxCorruptionRate": 0.05, "concurrency": 16}}
VERDICT_TIMEOUT = 600


@pytest.fixture(scope="module")
def world(cluster: LocalCluster, tmp_path_factory):
    with serving_reference_sample(cluster, NS, tmp_path_factory.mktemp("revision"), BUDGET):
        yield cluster


def status(cluster: LocalCluster) -> dict:
    return get_json(cluster, "dsv4", NAME, "-n", NS).get("status") or {}


def rollout(cluster: LocalCluster) -> dict:
    return status(cluster).get("rollout") or {}


def engine_templates(cluster: LocalCluster) -> dict[str, dict]:
    """The pod template of each stable engine StatefulSet (both slots)."""
    sets = get_json(cluster, "statefulset", "-n", NS, "-l", f"app.kubernetes.io/instance={NAME}")
    return {s["metadata"]["name"]: s["spec"]["template"] for s in sets["items"]}


# field changed → (spec patch, the transfer relation it must be promoted under)
CHANGES = {
    "tool-call parser": ({"model": {"toolCallParser": "deepseekv32"}}, "compatible"),
    "extraArgs": ({"prefill": {"extraArgs": ["--schedule-policy", "lpm"]}}, "compatible"),
    "env": ({"decode": {"env": [{"name": "DSV4_E2E_MARK", "value": "1"}]}}, "compatible"),
    "image": ({"image": {"name": "ghcr.io/dsv4/engine:0.1.1"}}, "incompatible"),
    "transfer backend": ({"disaggregation": {"transferBackend": "nixl"}}, "incompatible"),
    "speculative decoding": (
        {"decode": {"extraArgs": ["--speculative-algorithm", "EAGLE"]}},
        "incompatible",
    ),
}


@pytest.mark.parametrize("field", CHANGES)
def test_an_engine_change_is_canaried_and_promoted_only_on_its_pass(world, field):
    cluster = world
    patch, transfer = CHANGES[field]
    before = rollout(cluster)
    templates = engine_templates(cluster)
    cluster.kubectl(
        "patch", "dsv4", NAME, "-n", NS, "--type=merge", "-p", json.dumps({"spec": patch})
    )
    started = wait_for(
        f"a canary for the {field} change",
        lambda: (
            (r := rollout(cluster)).get("phase") in ("CanaryStarting", "Probing")
            and r.get("canaryRevision") != before.get("canaryRevision")
            and r
        ),
        60,
    )
    assert started["transfer"] == transfer
    assert started["stableRevision"] == before["stableRevision"]
    wait_for("probing", lambda: rollout(cluster).get("phase") != "CanaryStarting", 300)
    assert engine_templates(cluster) == templates, "production untouched while probed"
    done = wait_for(
        "promotion",
        lambda: (
            (
                (r := rollout(cluster)).get("phase") == "RolledBack"
                or (
                    r.get("phase") == "Idle"
                    and r.get("stableRevision") == started["canaryRevision"]
                )
            )
            and r
        ),
        VERDICT_TIMEOUT,
    )
    assert done["phase"] == "Idle" and done["verdict"] == "PASS", done.get("verdictReason")
    assert done["stableRevision"] == started["canaryRevision"]
    assert done["promotion"] == "Surge"
    assert done["slot"] != before.get("slot", "blue"), "pairs move to the other slot"
    wait_for("the new revision Ready", lambda: status(cluster).get("phase") == "Ready", 300)
    assert engine_templates(cluster) != templates
