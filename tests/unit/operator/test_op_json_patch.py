"""The smallest JSON patch between two documents: how the operator writes a status (the
fields that changed, not the whole status; nulls kept, since revisions hash them)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from dsv4_operator.kube.json_patch import json_patch, pointer
from tests.unit.operator.harness import World
from tests.unit.operator.memory_api import apply_json_patch

LEAVES = [0, 1, 1.0, True, False, None, "x", "", "a/b~c"]


def document(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """A JSON object with nested objects, lists, nulls and look-alike values."""
    doc: dict[str, Any] = {}
    for _ in range(rng.randrange(5)):
        key = rng.choice(["a", "b", "c", "d/e", "f~g"])
        kind = rng.randrange(3 if depth < 3 else 2)
        if kind == 0:
            doc[key] = rng.choice(LEAVES)
        elif kind == 1:
            doc[key] = [rng.choice(LEAVES) for _ in range(rng.randrange(3))]
        else:
            doc[key] = document(rng, depth + 1)
    return doc


def text(doc: dict[str, Any]) -> str:
    """As JSON: 1 and 1.0, true and 1 told apart (Python's == does not)."""
    return json.dumps(doc, sort_keys=True)


@pytest.mark.parametrize("seed", range(300))
def test_the_patch_applied_to_the_old_document_gives_the_new_one_exactly(seed):
    rng = random.Random(seed)
    old, new = document(rng), document(rng)
    patched = apply_json_patch({"status": old}, json_patch(old, new, "/status"))["status"]
    assert text(patched) == text(new)
    assert json_patch(new, new) == []


def test_the_patch_holds_only_what_changed():
    old = {"phase": "Progressing", "rollout": {"stable": {"a": 1}, "size": None}, "x": 1}
    new = {"phase": "Ready", "rollout": {"stable": {"a": 1}, "size": None}, "y/z": [1]}
    assert json_patch(old, new, "/status") == [
        {"op": "remove", "path": "/status/x"},
        {"op": "replace", "path": "/status/phase", "value": "Ready"},
        {"op": "add", "path": "/status/y~1z", "value": [1]},
    ]
    assert pointer("a~b", "c/d") == "/a~0b/c~1d"


def test_a_status_is_written_as_the_fields_that_changed():
    """Progressing → Ready changes the phase, conditions and replica counts; the rollout's
    stable revision (its flags, the largest part of a status) is not sent again."""
    world = World()
    world.create("flash")
    world.until("Ready", lambda: (world.obj().get("status") or {}).get("phase") == "Ready")
    writes = [w.body for w in world.api.log if w.verb == "status" and w.key[2] == "flash"]
    assert len(writes) >= 2
    first = {op["path"] for op in writes[0]["ops"]}
    assert first == {"/metadata/resourceVersion", "/status"}  # the first sends everything
    ready = {op["path"]: op.get("value") for op in writes[-1]["ops"]}
    assert ready["/status/phase"] == "Ready"
    assert not [path for path in ready if path.startswith("/status/rollout")]
    assert world.obj()["status"] == writes[-1]["status"]
    assert writes[-1]["status"]["rollout"] == writes[0]["status"]["rollout"]


def test_a_status_write_on_a_moved_object_is_refused_and_decided_again():
    """The resourceVersion op makes the patch conditional: a spec edit landing between the
    pass's read and its write is a conflict, and the pass decides again on the new spec."""
    world = World()
    world.create("flash")
    world.until("Ready", lambda: (world.obj().get("status") or {}).get("phase") == "Ready")

    def edit(api, key):
        api.before_status_write = None
        api.user_patch(*key, lambda obj: obj["spec"]["decode"].update(replicas=2))

    world.patch_spec("flash", {"prefill": {"replicas": 2}})
    world.api.before_status_write = edit
    world.reconcile("flash")
    status = world.obj()["status"]
    assert status["observedGeneration"] == world.obj()["metadata"]["generation"]


def test_a_status_edited_under_the_pass_so_its_patch_no_longer_applies_is_decided_again():
    """Someone removes a status field the pass's patch replaces: the API server refuses the
    patch (a 422, before it compares resourceVersions); the pass reads again and writes."""
    world = World()
    world.create("flash")
    world.until("Ready", lambda: (world.obj().get("status") or {}).get("phase") == "Ready")

    def edit(api, key):
        api.before_status_write = None
        obj = api.objects[key]
        del obj["status"]["conditions"]
        api._bump(obj)

    world.patch_spec("flash", {"decode": {"replicas": 2}})
    world.api.before_status_write = edit
    world.reconcile("flash")
    status = world.obj()["status"]
    assert status["observedGeneration"] == world.obj()["metadata"]["generation"]
    assert {c["type"] for c in status["conditions"]} >= {"Ready", "Progressing"}
