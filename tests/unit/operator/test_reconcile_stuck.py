"""No silent stuck states, against the in-memory API double (`harness`): a replica that does
not come up is shown with Kubernetes' own reason, past the progress deadline the deployment
is Degraded, and a canary the scheduler cannot place ends NoCapacity at its placement
timeout instead of waiting out its ready timeout, its flags not judged.  tests/e2e/test_stuck.py shows the same on
the real control plane (scheduler and StatefulSet controller included)."""

from __future__ import annotations

from dsv4_dev.cluster.nodes import default_pools, node_manifests
from dsv4_operator import metrics
from tests.unit.operator.harness import FP4, NS, World
from tests.unit.operator.test_reconcile_faults import ready_world

INSUFFICIENT = (
    "0/2 nodes are available: 2 Insufficient memory. preemption: 0/2 nodes are available: "
    "2 No preemption victims found for incoming pod."
)
QUOTA = (
    'pods "flash-decode-0" is forbidden: exceeded quota: gpus, requested: '
    "requests.nvidia.com/gpu=4, used: requests.nvidia.com/gpu=4, limited: requests.nvidia.com/gpu=4"
)


def condition(world: World, ctype: str) -> dict:
    return next(c for c in world.obj()["status"]["conditions"] if c["type"] == ctype)


def deadline_gauge(name: str = "flash") -> float | None:
    return metrics.REGISTRY.get_sample_value(
        "dsv4_operator_progress_deadline_exceeded", {"namespace": NS, "name": name}
    )


def stuck_decode(patch: dict | None = None) -> World:
    """A new deployment whose decode pods never come up."""
    world = World()
    world.held = lambda obj: obj["metadata"]["name"] == "flash-decode"
    world.create("flash", patch)
    world.step("flash")
    return world


def test_an_unschedulable_pod_is_named_in_the_status_and_an_event_with_the_schedulers_words():
    world = stuck_decode({"progressDeadlineSeconds": 120})
    world.api.unschedulable("flash-decode", INSUFFICIENT, world.now)
    world.api.lists.clear()
    world.step("flash")
    assert world.api.lists == {}, "pods and Events are read from the cache, not listed"
    progressing = condition(world, "Progressing")
    said = f"decode pod flash-decode-0: Unschedulable: {INSUFFICIENT}"
    assert (progressing["status"], progressing["reason"]) == ("True", "Unschedulable")
    assert progressing["message"].startswith("waiting for ready and updated replicas:")
    assert said in progressing["message"] and "decode 0/1" in progressing["message"]
    assert said in condition(world, "Ready")["message"]
    assert [e["message"] for e in world.events("Unschedulable")] == [progressing["message"]]
    assert world.obj()["status"]["phase"] == "Progressing"

    # Nothing moves: the status is not rewritten and the Event is not repeated.
    start = len(world.api.log)
    world.step("flash", seconds=30)
    assert world.api.log[start:] == []

    # Past the deadline (counted from the last progress): Degraded, with the same reason.
    world.until("Degraded", lambda: world.obj()["status"]["phase"] == "Degraded", seconds=30)
    degraded = condition(world, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "ProgressDeadlineExceeded")
    assert degraded["message"].startswith("no progress for 120s (spec.progressDeadlineSeconds):")
    assert said in degraded["message"]
    assert condition(world, "Progressing")["reason"] == "ProgressDeadlineExceeded"
    assert len(world.events("ProgressDeadlineExceeded")) == 1
    assert world.obj()["status"]["activeFeatures"] is not None, "the children run these flags"
    assert deadline_gauge() == 1.0

    # The cause goes away: the pod is placed and comes up, the deployment is Ready.
    world.api.objects.pop(("Pod", NS, "flash-decode-0"))
    world.held = lambda obj: False
    world.until("Ready", lambda: world.obj()["status"]["phase"] == "Ready")
    assert condition(world, "Degraded")["status"] == "False"
    assert deadline_gauge() == 0.0


def test_progress_resets_the_deadline():
    world = World()
    world.held = lambda obj: obj["metadata"]["name"] == "flash-decode"
    world.create("flash", {"progressDeadlineSeconds": 60, "decode": {"replicas": 2}})
    created = world.now
    world.step("flash")
    for _ in range(5):
        world.step("flash", seconds=10)
    live = world.api._stateful_set("flash-decode")  # one of two replicas comes up
    live["status"] = {"readyReplicas": 1, "observedGeneration": live["metadata"]["generation"]}
    world.step("flash", seconds=10)
    world.step("flash", seconds=10)
    assert (world.now - created).total_seconds() > 60
    assert world.obj()["status"]["phase"] == "Progressing", "a replica came up 10 s ago"
    world.until("Degraded", lambda: world.obj()["status"]["phase"] == "Degraded", seconds=10)


def test_a_pod_that_cannot_be_created_is_named_from_the_controllers_event():
    world = stuck_decode()
    world.api.failed_create("flash-decode", QUOTA, world.now)
    world.step("flash")
    progressing = condition(world, "Progressing")
    assert progressing["reason"] == "FailedCreate"
    assert f"decode StatefulSet flash-decode: FailedCreate: {QUOTA}" in progressing["message"]
    assert world.events("FailedCreate")


def test_a_settled_deployments_passes_send_no_request_at_all():
    world = ready_world()
    sent = world.api.requests()
    for _ in range(3):
        world.step("flash")
    assert world.api.requests() == sent


def canary_slice(world: World) -> bool:
    return ("StatefulSet", NS, "flash--canary-decode") in world.api.objects


def test_a_canary_the_scheduler_cannot_place_waits_ends_no_capacity_and_is_retried():
    """Capacity is not a verdict: the canary waits in CanaryPending with the scheduler's
    words, ends NoCapacity at its placement timeout (not the 900 s ready timeout), gives its
    slice back without rejecting the flags, and starts again once a GPU node is added."""
    world = ready_world()
    world.held = lambda obj: obj["metadata"]["name"] == "flash--canary-decode"
    world.patch_spec("flash", FP4)
    world.until("canary slice", lambda: world.phase() == "CanaryStarting" and canary_slice(world))
    reported = world.now
    world.api.unschedulable("flash--canary-decode", INSUFFICIENT, reported)
    recheck = world.reconcile("flash")
    assert recheck is not None and 0 < recheck <= 30, "the pass wakes up at the timeout"
    said = f"canary decode pod flash--canary-decode-0: Unschedulable: {INSUFFICIENT}"
    assert world.phase() == "CanaryPending", "within spec.canary.placementTimeoutSeconds"
    assert world.rollout()["message"].startswith(f"the canary cannot be placed: {said}")
    progressing = condition(world, "Progressing")
    assert progressing["reason"] == "RolloutCanaryPending" and said in progressing["message"]
    world.until("no capacity", lambda: world.rollout().get("verdict") == "NoCapacity", seconds=10)
    assert (world.now - reported).total_seconds() <= 30 + 10, "not the 900 s ready timeout"
    rollout = world.rollout()
    assert rollout["phase"] == "CanaryPending" and "rejectedRevision" not in rollout
    assert rollout["verdictReason"] == f"the canary cannot be placed: {said}"
    assert "are not rejected: tried again when a GPU node is added" in rollout["message"]
    assert [e["message"] for e in world.events("CanaryNoCapacity")] == [rollout["message"]]
    assert "Job" not in {kind for (kind, _, _) in world.api.objects}, "no probe ran"
    world.until("canary gone", lambda: not world.children("flash--canary"))
    for _ in range(3):  # no node added, no backoff over: it waits, holding no GPU
        world.step("flash", seconds=10)
    assert not world.children("flash--canary") and world.phase() == "CanaryPending"
    status = world.obj()["status"]
    assert status["phase"] != "Degraded" and condition(world, "Degraded")["status"] == "False"
    # A GPU node joins: the canary starts again, is placed this time, and passes.
    world.held = lambda obj: False
    *_, node = node_manifests(default_pools(gpu_nodes=3, cpu_nodes=0))
    world.api.user_apply(node)
    world.step("flash")
    assert world.phase() == "CanaryStarting" and canary_slice(world)
    assert world.events("CanaryRetried")
    world.until("promoted", lambda: world.phase() == "Idle")
    assert world.rollout()["verdict"] == "PASS"
