"""Status decisions: phase, conditions, replica counts, and no change when nothing changed."""

from dsv4_engine.features import EngineFeatures
from dsv4_operator.api.status import Phase, RoleStatus
from dsv4_operator.reconcile.status import Problem, decide_status, role_status


def sts(ready, updated, generation=2, observed=2, group="leader", slot="blue"):
    labels = {"inference.dsv4.dev/group-role": group, "inference.dsv4.dev/slot": slot}
    return {
        "kind": "StatefulSet",
        "metadata": {"generation": generation, "labels": labels},
        "status": {
            "readyReplicas": ready,
            "updatedReplicas": updated,
            "observedGeneration": observed,
        },
    }


def roles(ready=1, desired=1):
    role = RoleStatus(desired=desired, ready=ready, updated=ready, summary=f"{ready}/{desired}")
    return {"prefill": role, "decode": role, "router": role}


def decide(previous=None, now="2026-01-01T00:00:00Z", **kw):
    args = dict(
        generation=3,
        features=EngineFeatures(),
        revision="abc",
        roles=roles(),
        problem=None,
        applied=False,
        previous=previous,
        now=now,
    )
    args.update(kw)
    return decide_status(**args)


def test_ready_when_every_replica_is_ready_and_updated():
    status = decide()
    assert status.phase is Phase.READY and status.observed_generation == 3
    assert {c.type.value: c.status for c in status.conditions} == {
        "Ready": "True",
        "Progressing": "False",
        "Degraded": "False",
        "Reconciling": "False",
        "Stalled": "False",
    }
    assert status.decode.summary == "1/1" and status.engine_revision == "abc"


def test_progressing_while_applying_or_waiting():
    assert decide(applied=True).phase is Phase.PROGRESSING
    status = decide(roles=roles(ready=0))
    assert status.phase is Phase.PROGRESSING
    assert "decode 0/1" in next(c for c in status.conditions if c.type == "Progressing").message


def test_degraded_keeps_the_flags_that_run():
    ready = decide()
    status = decide(
        previous=ready,
        problem=Problem("NoAllowedGPUNodes", "no node …"),
        revision="new",
        now="2026-01-02T00:00:00Z",
    )
    assert status.phase is Phase.DEGRADED and status.engine_revision == "abc"
    degraded = next(c for c in status.conditions if c.type == "Degraded")
    assert (degraded.status, degraded.reason) == ("True", "NoAllowedGPUNodes")
    assert degraded.last_transition_time == "2026-01-02T00:00:00Z"


def test_unchanged_world_gives_an_equal_status_later():
    first = decide(now="2026-01-01T00:00:00Z")
    assert decide(previous=first, now="2026-01-01T00:05:00Z") == first


def test_role_status_counts_replicas_not_pods():
    assert role_status(2, [sts(2, 2)]) == RoleStatus(desired=2, ready=2, updated=2, summary="2/2")
    stale = role_status(1, [sts(1, 1, generation=3, observed=2)])
    assert (stale.ready, stale.updated) == (1, 0)
    assert role_status(1, []).ready == 0


def test_role_status_sums_both_slots_of_a_paired_promotion():
    """Mid-pairing the old slot and the new one both serve: each counts what it has."""
    both = role_status(2, [sts(1, 1), sts(1, 1, slot="green")])
    assert (both.ready, both.summary) == (2, "2/2")


def test_degraded_before_anything_ran_claims_no_flags():
    status = decide(problem=Problem("PVCNotFound", "spec.model.pvc.claimName: …"))
    assert status.active_features is None and status.engine_revision is None


def test_a_rendered_multinode_role_counts_leaderworkerset_groups():
    """The workloads as rendered (not hand-built): a multi-node role is one LeaderWorkerSet,
    whose status counts groups (a group is ready when all its pods are; LWS's own rule)."""
    from dsv4_operator.api.samples import shipped_sample
    from dsv4_operator.api.spec import DSV4DeploymentSpec
    from dsv4_operator.reconcile.status import observe_roles
    from dsv4_operator.render import render_all
    from dsv4_operator.render.meta import WORKLOAD_KINDS, Owner

    spec = DSV4DeploymentSpec.model_validate(shipped_sample("pro-gb200-nvl72")["spec"])
    workloads = [
        {**o, "status": {"readyReplicas": o["spec"]["replicas"], "observedGeneration": 1,
                         "updatedReplicas": o["spec"]["replicas"]}}
        for o in render_all(Owner("pro", "ns", "uid"), spec)
        if o["kind"] in WORKLOAD_KINDS
    ]  # fmt: skip
    assert {o["kind"] for o in workloads} == {"LeaderWorkerSet", "Deployment"}
    for o in workloads:
        o["metadata"]["generation"] = 1
    owner = Owner("pro", "ns", "uid")
    roles = observe_roles(spec, workloads, owner)
    assert roles["prefill"].summary == "2/2" and roles["decode"].summary == "1/1"
    assert roles["decode"].selector == (
        "app.kubernetes.io/name=dsv4,app.kubernetes.io/instance=pro,"
        "app.kubernetes.io/component=decode,inference.dsv4.dev/group-role=leader"
    )
    decode = next(o for o in workloads if o["metadata"]["name"] == "pro-decode")
    decode["status"]["readyReplicas"] = 0  # a pod of decode's one group is not ready
    assert observe_roles(spec, workloads, owner)["decode"].summary == "0/1"
