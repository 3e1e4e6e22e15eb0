"""The Argo CD health check (manifests/argocd/health.lua) run by a real Lua interpreter
(lupa) against the status the operator's own code writes (the in-memory harness): a
rejected rollout is Degraded with its verdict, a canary Progressing, a settled deployment
whose spec's flags serve Healthy.  Argo CD runs gopher-lua (Lua 5.1); the script uses
nothing newer."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from lupa import LuaRuntime

from tests.unit.operator.harness import FAIL, HICACHE, World

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = (ROOT / "manifests" / "argocd" / "health.lua").read_text()
ARGOCD_KEY = "resource.customizations.health.inference.dsv4.dev_DSV4Deployment"

pytestmark = pytest.mark.slow


def health(obj: dict[str, Any]) -> dict[str, str]:
    """What Argo CD would show for ``obj``: {"status": ..., "message": ...}."""
    lua = LuaRuntime()
    check = lua.eval(f"function(obj)\n{SCRIPT}\nend")
    return dict(check(lua.table_from(obj, recursive=True)).items())


def ready_world() -> World:
    world = World()
    world.create("flash")
    world.until("Ready", lambda: (world.obj().get("status") or {}).get("phase") == "Ready")
    return world


def test_a_settled_deployment_is_healthy_a_canary_progressing_a_rejection_degraded():
    world = ready_world()
    assert health(world.obj())["status"] == "Healthy"
    world.verdict = lambda job: FAIL
    world.patch_spec("flash", HICACHE)
    edited = health(world.obj())
    assert edited == {
        "status": "Progressing",
        "message": "Waiting for the operator to observe the latest spec",
    }
    world.until("probing", lambda: world.phase() == "Probing")
    probing = health(world.obj())
    assert probing["status"] == "Progressing"
    assert probing["message"].startswith("RolloutProbing: canary Ready; probing it")
    world.until("rolled back", lambda: world.phase() == "RolledBack")
    world.until("settled", lambda: not world.children("flash--canary"))
    world.step("flash")
    status = world.obj()["status"]
    assert status["observedGeneration"] == world.obj()["metadata"]["generation"]
    rejected = health(world.obj())
    assert rejected["status"] == "Degraded", rejected
    assert rejected["message"].startswith("RolloutRejected: the canary rejected flags")
    assert "(FAIL): 4/26 corrupt" in rejected["message"]
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False", "the rejected spec is not Ready"


def test_a_promotion_is_progressing_until_the_new_flags_serve():
    world = ready_world()
    world.patch_spec("flash", HICACHE)
    world.until("promoting", lambda: world.phase() == "Promoting")
    assert health(world.obj())["status"] == "Progressing"
    world.until("promoted", lambda: world.phase() == "Idle")
    world.until("Ready", lambda: world.obj()["status"]["phase"] == "Ready")
    assert health(world.obj())["status"] == "Healthy"


def test_no_status_yet_is_progressing():
    world = World()
    world.create("flash")
    obj = copy.deepcopy(world.obj())
    assert health(obj)["status"] == "Progressing"


def test_the_install_docs_give_argo_cd_this_script_under_its_key():
    install = (ROOT / "docs" / "install.md").read_text()
    assert ARGOCD_KEY in install and "manifests/argocd/health.lua" in install
