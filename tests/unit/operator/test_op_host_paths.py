"""A model on the node's own filesystem only under a prefix the operator allows; anything
else is refused before a child is written, with a condition naming the field."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dsv4_operator.api.host_paths import host_path_problem, parse_prefixes
from dsv4_operator.runtime import parse_args
from tests.unit.operator.harness import MODEL_HOST_PATHS, World

ALLOWED = ("/data/models", "/mnt/weights")


@pytest.mark.parametrize(
    "path",
    ["/data/models", "/data/models/deepseek-v4-flash", "/mnt/weights/a/b", "/data/models/"],
)
def test_paths_under_an_allowed_prefix_are_accepted(path):
    assert host_path_problem(path, "serving", ALLOWED) is None


@pytest.mark.parametrize(
    "path",
    ["/data/models-old", "/data", "/", "/etc", "/data/models/../../etc", "data/models/x"],
)
def test_anything_else_is_refused_naming_the_field(path):
    problem = host_path_problem(path, "serving", ALLOWED)
    assert problem is not None and problem.startswith("spec.model.hostPath: ")


def test_no_prefix_allows_no_host_path():
    problem = host_path_problem("/data/models/x", "serving", ())
    assert "--allowed-model-host-paths: none" in problem
    assert "spec.model.pvc" in problem  # what to do instead


def test_the_flag_takes_a_comma_list_of_absolute_paths(capsys):
    assert parse_prefixes("/data/models, /mnt/weights/") == ALLOWED
    args = parse_args(["run", "--allowed-model-host-paths", "/data/models,/mnt/weights"])
    assert args.allowed_model_host_paths == ALLOWED
    assert parse_args(["run"]).allowed_model_host_paths == ()
    for bad in ("models", "/data/../etc", "Tenant_A=/data/models"):
        with pytest.raises(SystemExit) as exited:
            parse_args(["run", "--allowed-model-host-paths", bad])
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert "--allowed-model-host-paths" in err and "not a" in err


def condition(world, kind):
    conditions = (world.obj().get("status") or {}).get("conditions") or []
    return next(c for c in conditions if c["type"] == kind)


def test_a_host_path_outside_the_allow_list_degrades_the_deployment_and_writes_nothing():
    world = World()
    assert MODEL_HOST_PATHS == ("/data/models",)
    world.create("flash", {"model": {"hostPath": "/etc/kubernetes"}})
    world.step("flash")
    degraded = condition(world, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "HostPathNotAllowed")
    assert degraded["message"].startswith("spec.model.hostPath: /etc/kubernetes is not under")
    assert world.children("flash") == {}
    assert world.events("HostPathNotAllowed")  # said once, as an Event too

    world.patch_spec("flash", {"model": {"hostPath": "/data/models/deepseek-v4-flash"}})
    world.step("flash")
    assert condition(world, "Degraded")["status"] == "False"
    assert ("StatefulSet", "flash-decode") in world.children("flash")


def test_an_entry_scoped_to_a_namespace_allows_its_directory_there_only():
    """The review's cross-tenant mount: tenant-a's weights, scoped to tenant-a, are refused
    to a deployment in tenant-b; a bare entry still allows every namespace."""
    allowed = parse_prefixes("tenant-a=/data/models/tenant-a/, /data/shared")
    assert allowed == ("tenant-a=/data/models/tenant-a", "/data/shared")
    assert host_path_problem("/data/models/tenant-a/v4", "tenant-a", allowed) is None
    problem = host_path_problem("/data/models/tenant-a/v4", "tenant-b", allowed)
    assert problem == (
        "spec.model.hostPath: /data/models/tenant-a/v4 is not under a host path the operator "
        "allows in namespace tenant-b (--allowed-model-host-paths: /data/shared); read the "
        "model from a PersistentVolumeClaim (spec.model.pvc), or ask the operator's "
        "administrator to allow the directory here"
    )
    assert host_path_problem("/data/shared/x", "tenant-b", allowed) is None


def test_a_deployment_in_another_namespace_than_the_directorys_degrades():
    world = World()
    world.reconciler.allowed = replace(
        world.reconciler.allowed, model_host_paths=("elsewhere=/data/models",)
    )
    world.create("flash", {"model": {"hostPath": "/data/models/deepseek-v4-flash"}})
    world.step("flash")
    degraded = condition(world, "Degraded")
    assert degraded["reason"] == "HostPathNotAllowed"
    assert "not under a host path the operator allows in namespace serving" in degraded["message"]
    assert world.children("flash") == {}
