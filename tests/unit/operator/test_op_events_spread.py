"""Events inform without flooding, and periodic work is spread (docs/dsv4deployment.md#scale):
a pass that writes a dozen children records one Event naming them; an Event that recurs is
counted on the first one, as Kubernetes' own recorder does; deployments created together
start their production watch runs at different times, fixed by their UIDs."""

from __future__ import annotations

import datetime as dt

from dsv4_operator.reconcile.events import EventRecorder
from dsv4_operator.spread import first_due, next_slot, phase
from tests.unit.operator.harness import NS, T0, World
from tests.unit.operator.memory_api import MemoryApi

FLASH = {"metadata": {"name": "flash", "namespace": NS, "uid": "uid-flash"}}


def events(api: MemoryApi) -> list[dict]:
    return [obj for (kind, _, _), obj in api.objects.items() if kind == "Event"]


def test_a_first_pass_records_one_event_with_its_flags_children_and_phase():
    world = World()
    world.create("flash", {"decode": {"replicas": 2}})
    world.reconcile("flash")
    applied = [w for w in world.api.log if w.verb == "apply" and w.key[0] != "DSV4Deployment"]
    assert len(applied) >= 12  # the engine ConfigMap, StatefulSets, Services, router, RBAC
    assert [e["reason"] for e in events(world.api)] == ["Initialized"]
    message = events(world.api)[0]["message"]
    revision = world.rollout()["stableRevision"]
    assert message.startswith(f"revision {revision}: hicache=off")
    assert message.endswith("; phase Progressing")
    for _, _, name in {w.key for w in applied}:
        assert name in message


def test_a_later_pass_that_writes_every_child_records_one_applied_event_naming_them():
    world = World()
    world.create("flash")
    world.until("Ready", lambda: (world.obj().get("status") or {}).get("phase") == "Ready")
    world.patch_spec("flash", {"decode": {"replicas": 2}, "prefill": {"replicas": 2}})
    start = len(world.api.log)
    world.reconcile("flash")
    written = {w.key for w in world.api.log[start:] if w.verb == "apply"}
    (recorded,) = world.events("Applied")
    assert len(written) >= 2
    for _, _, name in written:
        assert name in recorded["message"]


def test_a_recurring_event_is_counted_on_the_first_one_not_copied():
    api = MemoryApi()
    recorder = EventRecorder(api, clock=lambda: T0)
    for _ in range(3):
        recorder.record(FLASH, "Warning", "Drift", "StatefulSet flash-decode edited")
    recorder.record(FLASH, "Warning", "Drift", "Service flash-router edited")
    counted = sorted((e["message"], e["count"]) for e in events(api))
    assert counted == [("Service flash-router edited", 1), ("StatefulSet flash-decode edited", 3)]


def test_an_expired_event_is_recorded_anew():
    api = MemoryApi()
    recorder = EventRecorder(api, clock=lambda: T0)
    recorder.record(FLASH, "Normal", "PhaseReady", "Ready")
    for key in [k for k in api.objects if k[0] == "Event"]:
        del api.objects[key]  # the API server dropped it (Events live an hour)
    recorder.record(FLASH, "Normal", "PhaseReady", "Ready")
    assert [e["count"] for e in events(api)] == [1]


def test_phases_are_fixed_by_the_uid_and_spread_evenly():
    uids = [f"0b7c{i:04x}-uid" for i in range(1000)]
    assert [phase(u) for u in uids] == [phase(u) for u in uids]
    tenths = [0] * 10
    for uid in uids:
        tenths[int(phase(uid) * 10)] += 1
    assert all(60 <= n <= 140 for n in tenths), tenths


def test_next_slot_lands_on_the_offset_at_or_after_the_time():
    assert next_slot(100.0, 60.0, 0.25) == 135.0  # 15 s into the period 120-180
    assert next_slot(135.0, 60.0, 0.25) == 135.0
    assert next_slot(136.0, 60.0, 0.25) == 195.0
    assert first_due(0.0, 600.0, 0.0) == 300.0 and first_due(0.0, 600.0, 0.999) < 900.0


def test_deployments_created_together_start_their_production_watch_apart():
    world = World()
    names = [f"d{i}" for i in range(6)]
    for name in names:
        world.create(name)  # the default interval: 600 s
    started: dict[str, dt.datetime] = {}

    def all_started() -> bool:
        for name in names:
            watch = world.rollout(name).get("stableProbe")
            if watch and name not in started:
                started[name] = world.now
        return len(started) == len(names)

    world.until("every first watch run", all_started, *names, passes=40, seconds=30)
    after = {n: (t - T0).total_seconds() for n, t in started.items()}
    assert all(300 - 30 <= s <= 900 + 30 for s in after.values()), after
    assert len(set(after.values())) >= 4, f"in lock-step: {after}"
