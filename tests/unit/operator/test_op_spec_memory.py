"""A deployment's spec is parsed once per version of it: passes over an unchanged spec reuse
the parse (and the revision it asks for), an edit is parsed anew and acted on, a spec that
does not parse is refused on every pass, and a deleted deployment's parse is dropped."""

import asyncio
import json
from typing import Any

import pytest

from dsv4_operator.api.samples import load_sample
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.reconcile import specs
from dsv4_operator.reconcile.controller import Controller
from dsv4_operator.reconcile.specs import SpecMemory
from tests.unit.operator.harness import World
from tests.unit.operator.test_reconcile_faults import ready_world


class Counted:
    """`DSV4DeploymentSpec` as `reconcile.specs` sees it, counting its parses."""

    def __init__(self) -> None:
        self.parses = 0

    def model_validate(self, raw: dict[str, Any]) -> DSV4DeploymentSpec:
        self.parses += 1
        return DSV4DeploymentSpec.model_validate(raw)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Counted:
    counting = Counted()
    monkeypatch.setattr(specs, "DSV4DeploymentSpec", counting)
    return counting


def phase(world: World) -> str:
    return world.obj()["status"]["phase"]


def test_passes_over_an_unchanged_spec_parse_it_once_and_an_edit_is_parsed_and_acted_on(counted):
    world = ready_world()
    parses = counted.parses
    for _ in range(3):
        world.step("flash")
    assert counted.parses == parses, "a settled deployment's passes reuse the parse"

    world.patch_spec("flash", {"decode": {"replicas": 2}})
    world.until("decode 2/2", lambda: world.obj()["status"]["decode"]["summary"] == "2/2")
    assert counted.parses == parses + 1, "the edited spec is parsed once, then reused"
    assert phase(world) == "Ready"


def test_a_spec_that_does_not_parse_is_refused_on_every_pass(counted):
    world = ready_world()
    world.patch_spec("flash", {"decode": {"replicas": -1}})
    for _ in range(2):
        before = counted.parses
        world.step("flash")
        assert counted.parses == before + 1, "an invalid spec is not kept: each pass parses it"
        reasons = {c["reason"] for c in world.obj()["status"]["conditions"]}
        assert "InvalidSpec" in reasons


def test_one_parse_per_spec_and_deployment_and_its_revision_derived_once():
    memory = SpecMemory()
    raw = load_sample()["spec"]
    first = memory.parse("u-1", raw)
    again = memory.parse("u-1", json.loads(json.dumps(raw)))  # another dict, the same bytes
    assert again is first and again.asked is first.asked
    assert memory.parse("u-2", raw) is not first, "kept per deployment"
    edited = memory.parse("u-1", {**raw, "progressDeadlineSeconds": 900})
    assert edited is not first and edited.spec.progress_deadline_seconds == 900


def test_a_deleted_deployments_parse_is_dropped():
    world = ready_world()
    obj = world.obj()
    uid = obj["metadata"]["uid"]
    kept = world.reconciler.specs.parse(uid, obj["spec"])

    async def delete() -> None:
        loop = asyncio.get_running_loop()
        controller = Controller(world.reconciler, world.cache, loop, workers=1, resync_s=3600)
        controller.deployment_event("DELETED", obj)

    asyncio.run(delete())
    assert world.reconciler.specs.parse(uid, obj["spec"]) is not kept
