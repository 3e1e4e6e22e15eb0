"""Multi-node roles need LeaderWorkerSet, and only they: without LWS installed a multi-node
spec is Degraded with a condition naming the field, a single-node one runs as before, and
installing LWS later lets the same deployment come up (nothing crash-loops meanwhile)."""

from __future__ import annotations

from tests.unit.operator.harness import World

MULTI = {"decode": {"nodesPerReplica": 2, "gpusPerNode": 8, "tp": 16}}


def condition(world: World, name: str, ctype: str) -> dict:
    status = world.obj(name).get("status") or {}
    return next(c for c in status.get("conditions", []) if c["type"] == ctype)


def test_without_lws_a_multinode_spec_is_degraded_naming_the_field_and_writes_nothing():
    world = World()
    world.api.unserved.add("LeaderWorkerSet")
    world.create("flash", MULTI)
    world.step("flash")
    degraded = condition(world, "flash", "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "LeaderWorkerSetMissing")
    assert degraded["message"].startswith("spec.decode.nodesPerReplica: 2 nodes per replica")
    assert "leaderworkerset.x-k8s.io/v1" in degraded["message"]
    assert not world.api.names("StatefulSet") and not world.api.names("ConfigMap")

    world.api.unserved.clear()  # LWS installed: the next pass makes the children
    world.until("Ready", lambda: (world.obj().get("status") or {}).get("phase") == "Ready", "flash")
    assert world.api.names("LeaderWorkerSet") == {"flash-decode"}
    assert world.api.names("StatefulSet") == {"flash-prefill"}


def test_without_lws_a_single_node_spec_is_unaffected():
    world = World()
    world.api.unserved.add("LeaderWorkerSet")
    world.create("flash")
    world.until("Ready", lambda: (world.obj().get("status") or {}).get("phase") == "Ready", "flash")
    assert world.api.names("StatefulSet") == {"flash-prefill", "flash-decode"}
