"""Which workload status updates wake a pass (`reconcile.triggers`): those that move what a
pass makes of the workload's progress, as the controllers of a real cluster write them."""

from __future__ import annotations

from typing import Any

from dsv4_operator.reconcile.triggers import child_changed
from dsv4_operator.render.meta import Owner, metadata

OWNER = Owner("flash", "serving", "uid-flash")


def statefulset(generation: int = 1, **status: Any) -> dict[str, Any]:
    meta = metadata(OWNER, "flash-decode", "decode")
    meta["annotations"] = {"inference.dsv4.dev/applied-hash": "h"}
    meta["generation"] = generation
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": meta,
        "spec": {"replicas": 2},
        "status": status,
    }


REVISIONS = {"currentRevision": "r1", "updateRevision": "r1"}
CREATED = statefulset()  # as the operator applied it: no status yet
SEEN = statefulset(observedGeneration=1, replicas=0, availableReplicas=0, **REVISIONS)
MADE = statefulset(observedGeneration=1, replicas=2, updatedReplicas=2, **REVISIONS)
READY = statefulset(
    observedGeneration=1, replicas=2, updatedReplicas=2, readyReplicas=2, availableReplicas=2,
    **REVISIONS,
)  # fmt: skip


def test_the_controller_seeing_the_spec_before_any_pod_wakes_nothing():
    # The StatefulSet controller's first status update: the same 0 ready, 0 updated.
    assert not child_changed(CREATED, SEEN)


def test_pods_made_updated_and_ready_each_wake_a_pass():
    assert child_changed(SEEN, MADE)  # the status shows 2 updated
    assert child_changed(MADE, READY)  # 2 ready, settled
    assert child_changed(SEEN, READY)  # both in one update, as on KWOK


def test_counts_that_become_current_wake_a_pass():
    """A spec change its controller has not seen yet counts no replica updated; when it
    has, the same updatedReplicas count: what the pass makes of it moved."""
    stale = statefulset(generation=2, **{**READY["status"]})
    current = statefulset(generation=2, **{**READY["status"], "observedGeneration": 2})
    assert child_changed(stale, current)


def test_counts_no_pass_reads_wake_nothing():
    later = statefulset(**{**READY["status"], "collisionCount": 0, "currentReplicas": 2})
    assert not child_changed(READY, later)
