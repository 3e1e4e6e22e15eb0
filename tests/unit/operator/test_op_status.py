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
    }
    assert status.decode.summary == "1/1" and status.feature_revision == "abc"


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
    assert status.phase is Phase.DEGRADED and status.feature_revision == "abc"
    degraded = next(c for c in status.conditions if c.type == "Degraded")
    assert (degraded.status, degraded.reason) == ("True", "NoAllowedGPUNodes")
    assert degraded.last_transition_time == "2026-01-02T00:00:00Z"


def test_unchanged_world_gives_an_equal_status_later():
    first = decide(now="2026-01-01T00:00:00Z")
    assert decide(previous=first, now="2026-01-01T00:05:00Z") == first


def test_role_status_counts_replicas_not_pods():
    assert role_status(2, 1, [sts(2, 2)]) == RoleStatus(
        desired=2, ready=2, updated=2, summary="2/2"
    )
    multi = role_status(2, 3, [sts(2, 2), sts(3, 4, group="worker")])
    assert (multi.ready, multi.updated) == (1, 2)
    stale = role_status(1, 1, [sts(1, 1, generation=3, observed=2)])
    assert (stale.ready, stale.updated) == (1, 0)
    assert role_status(1, 1, []).ready == 0


def test_role_status_sums_both_slots_of_a_paired_promotion():
    """Mid-pairing the old slot and the new one both serve: each counts what it has, a
    multi-node slot only its complete replicas."""
    both = role_status(2, 1, [sts(1, 1), sts(1, 1, slot="green")])
    assert (both.ready, both.summary) == (2, "2/2")
    multi = [sts(2, 2), sts(2, 2, group="worker"), sts(1, 1, slot="green")]
    # green has its leader but no workers' set yet: none of its replicas is complete.
    assert role_status(2, 2, multi).ready == 2


def test_degraded_before_anything_ran_claims_no_flags():
    status = decide(problem=Problem("PVCNotFound", "spec.model.pvc.claimName: …"))
    assert status.active_features is None and status.feature_revision is None


def test_a_rendered_multinode_role_is_ready_once_leaders_and_workers_are():
    """The StatefulSets as rendered (not hand-built): the workers' set is told apart."""
    from dsv4_operator.api.samples import shipped_sample
    from dsv4_operator.api.spec import DSV4DeploymentSpec
    from dsv4_operator.reconcile.status import observe_roles
    from dsv4_operator.render import render_all
    from dsv4_operator.render.meta import Owner

    spec = DSV4DeploymentSpec.model_validate(shipped_sample("pro-gb200-nvl72")["spec"])
    workloads = [
        {**o, "status": {"readyReplicas": o["spec"]["replicas"], "observedGeneration": 1,
                         "updatedReplicas": o["spec"]["replicas"]}}
        for o in render_all(Owner("pro", "ns", "uid"), spec)
        if o["kind"] in ("StatefulSet", "Deployment")
    ]  # fmt: skip
    for o in workloads:
        o["metadata"]["generation"] = 1
    roles = observe_roles(spec, workloads)
    assert roles["prefill"].summary == "2/2" and roles["decode"].summary == "1/1"
    workers = next(o for o in workloads if o["metadata"]["name"] == "pro-decode-workers")
    workers["status"]["readyReplicas"] = 6  # one of decode's 7 worker pods is not ready
    assert observe_roles(spec, workloads)["decode"].summary == "0/1"
