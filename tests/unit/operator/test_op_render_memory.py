"""Rendered children are kept across passes: a pass that wants what an earlier one wanted
(same owner, spec and rollout status) gets it without rendering again, as objects of its
own; anything else that renders differently is rendered again."""

import datetime as dt
import json

from dsv4_engine.features import Role
from dsv4_operator.api.rollout import RolloutStatus
from dsv4_operator.api.samples import load_sample
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.reconcile.desired import Desired, RenderMemory
from dsv4_operator.render.memory import pod_memory
from dsv4_operator.render.meta import Owner
from dsv4_operator.rollout.decide import first_status
from dsv4_operator.rollout.slices import spec_revision

OWNER = Owner(name="flash", namespace="serving", uid="u-1")
NOW = dt.datetime(2026, 12, 6, tzinfo=dt.UTC)


class CountingMemory:
    """The host memory a pod asks for (`pod_memory`), counting the roles it was asked for:
    every render of an engine workload asks."""

    def __init__(self):
        self.asked = 0

    def __call__(self, spec: DSV4DeploymentSpec, role: Role) -> str:
        self.asked += 1
        return pod_memory(spec, role)


def spec(**changes):
    return DSV4DeploymentSpec.model_validate({**load_sample()["spec"], **changes})


def test_a_pass_wanting_what_an_earlier_one_wanted_is_not_rendered_again():
    memory, kept = CountingMemory(), RenderMemory()
    wanted = spec()
    status = first_status(spec_revision(wanted), NOW).status
    first = kept.children(Desired(OWNER, wanted, memory), status)
    rendered = memory.asked
    assert rendered > 0
    again = kept.children(Desired(OWNER, wanted, memory), status)
    assert memory.asked == rendered
    assert again == first == Desired(OWNER, wanted, pod_memory).children(status)
    # Each pass holds objects of its own: changing one changes no later pass's.
    again[0]["metadata"]["name"] = "changed"
    assert kept.children(Desired(OWNER, wanted, memory), status) == first


def test_another_spec_status_or_owner_is_rendered_again_and_a_deleted_one_forgotten():
    memory, kept = CountingMemory(), RenderMemory()
    wanted = spec()
    status = first_status(spec_revision(wanted), NOW).status
    kept.children(Desired(OWNER, wanted, memory), status)
    asked = memory.asked

    scaled = spec(decode={"replicas": 3})
    bigger = kept.children(Desired(OWNER, scaled, memory), status)
    assert memory.asked > asked
    assert bigger == Desired(OWNER, scaled, pod_memory).children(status)

    later = first_status(spec_revision(wanted), NOW + dt.timedelta(seconds=5)).status
    asked = memory.asked
    kept.children(Desired(OWNER, wanted, memory), later)
    assert memory.asked > asked

    other = Owner(name="flash", namespace="serving", uid="u-2")  # recreated under the name
    asked = memory.asked
    theirs = kept.children(Desired(other, wanted, memory), status)
    assert memory.asked > asked
    assert {r["uid"] for o in theirs for r in o["metadata"]["ownerReferences"]} == {"u-2"}

    kept.forget("u-1")
    asked = memory.asked
    kept.children(Desired(OWNER, wanted, memory), status)
    assert memory.asked > asked


def test_the_active_slot_is_kept_apart_from_the_children():
    """A pass also renders its status's active slot (to see what has rolled): kept as well,
    and never answered with the children (or the other way round)."""
    memory, kept = CountingMemory(), RenderMemory()
    wanted = spec()
    status = first_status(spec_revision(wanted), NOW).status
    active = kept.active(Desired(OWNER, wanted, memory), status)
    asked = memory.asked
    assert kept.active(Desired(OWNER, wanted, memory), status) == active
    assert memory.asked == asked
    assert active == Desired(OWNER, wanted, pod_memory).active(status)
    children = kept.children(Desired(OWNER, wanted, memory), status)
    assert children == Desired(OWNER, wanted, pod_memory).children(status) != active


def as_the_api_server_returns(status: RolloutStatus) -> RolloutStatus:
    """``status`` written and read back: the API server holds JSON objects as maps, so they
    come back with their keys sorted, and a whole float (`1.0`) as an integer."""
    written = json.dumps(status.model_dump(mode="json", by_alias=True, exclude_none=True))
    stored = json.loads(
        written, parse_float=lambda s: int(float(s)) if float(s).is_integer() else float(s)
    )
    return RolloutStatus.model_validate(json.loads(json.dumps(stored, sort_keys=True)))


def test_the_next_pass_reading_the_written_status_back_is_not_rendered_again():
    """A first pass renders for the status it decides; the next reads that status back from
    the API server, reordered, and must find the same renders (in bench-scale every second
    pass rendered again until the revision's spec kept its keys sorted)."""
    memory, kept = CountingMemory(), RenderMemory()
    wanted = spec()
    decided = first_status(spec_revision(wanted), NOW).status
    first = kept.children(Desired(OWNER, wanted, memory), decided)
    asked = memory.asked
    read_back = as_the_api_server_returns(decided)
    assert read_back == decided
    assert kept.children(Desired(OWNER, wanted, memory), read_back) == first
    assert memory.asked == asked
