"""Images, tolerations, device resources and priority classes only from the administrator's
allow-lists (`api.allowed`): a
deployment asking for another is refused before any child is written, with a condition
naming the field and the list.  The fence applies the same rules to the operator's own
writes on the real API server (tests/e2e/test_namespaced_install.py, which also feeds
both the same cases)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dsv4_operator.api.allowed import (
    SHIPPED,
    Allowed,
    image_allowed,
    parse_devices,
    parse_images,
    parse_priority_classes,
    parse_tolerations,
    toleration_text,
)
from dsv4_operator.runtime import allowed_by, parse_args
from tests.unit.operator.harness import FP4, World

# (image, allowed by `ghcr.io/dsv4, lmsysorg/sglang:, registry.example/team/engine@sha256:`)
IMAGE_CASES = [
    ("ghcr.io/dsv4/engine:0.1.0", True),
    ("ghcr.io/dsv4/engine@sha256:" + "a" * 64, True),
    ("ghcr.io/dsv4", True),
    ("ghcr.io/dsv4:latest", True),
    ("ghcr.io/dsv4-evil/engine:1", False),  # not a path below the entry
    ("ghcr.io/dsv4evil:1", False),
    ("ghcr.io/dsv", False),
    ("evil.example/ghcr.io/dsv4/engine:1", False),
    ("lmsysorg/sglang:v0.5.23-cu130", True),  # an entry ending in `:`: every tag
    ("lmsysorg/sglang-evil:v1", False),
    ("docker.io/lmsysorg/sglang:v0.5.23-cu130", False),  # compared as written
    ("registry.example/team/engine@sha256:" + "b" * 64, True),
    ("registry.example/team/engine:latest", False),
    ("busybox", False),
]
IMAGES = ("ghcr.io/dsv4", "lmsysorg/sglang:", "registry.example/team/engine@sha256:")

# (toleration, its text in the list's notation)
TOLERATION_CASES = [
    (
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        "nvidia.com/gpu:NoSchedule",
    ),
    (
        {"key": "pool", "operator": "Equal", "value": "a", "effect": "NoSchedule"},
        "pool=a:NoSchedule",
    ),
    ({"key": "pool", "value": "a"}, "pool=a"),  # operator Equal by default; every effect
    ({"key": "pool", "operator": "Exists"}, "pool"),
    ({"operator": "Exists"}, "*"),  # every taint
    ({"key": "", "operator": "Exists", "effect": "NoExecute"}, "*:NoExecute"),
]


@pytest.mark.parametrize(("image", "allowed"), IMAGE_CASES)
def test_an_image_is_allowed_when_it_is_an_entry_or_lies_below_one(image, allowed):
    assert image_allowed(image, IMAGES) is allowed


@pytest.mark.parametrize(("toleration", "text"), TOLERATION_CASES)
def test_a_toleration_is_written_as_the_taint_it_tolerates(toleration, text):
    assert toleration_text(toleration) == text
    assert parse_tolerations(text) == (text,)  # every text is a valid entry


@pytest.mark.parametrize(
    "bad", ["=a", "pool=a:NoWhere", "*=a", "pool=a b", ":NoSchedule", "pool:", "a,b c"]
)
def test_a_malformed_toleration_entry_is_refused_naming_the_flag(bad):
    with pytest.raises(ValueError, match="--allowed-tolerations"):
        parse_tolerations(bad)


@pytest.mark.parametrize("bad", ["memory", "cpu", "/ib", "rdma/", "rdma/a b", "RDMA/ib"])
def test_a_device_entry_that_is_no_extended_resource_is_refused_naming_the_flag(bad):
    with pytest.raises(ValueError, match="--allowed-device-resources"):
        parse_devices(bad)


def test_an_allowed_rdma_device_is_rendered_and_another_list_allows_another():
    world = World()
    world.create("flash", {"decode": {"resources": {"rdma": {"resourceName": "rdma/ib"}}}})
    world.step("flash")
    assert condition(world, "Degraded")["status"] == "False"
    args = parse_args(["run", "--allowed-device-resources", "example.com/roce"])
    assert allowed_by(args).device_resources == ("example.com/roce",)


@pytest.mark.parametrize("bad", ["/ghcr.io", ":tag", "ghcr.io/a b"])
def test_a_malformed_image_entry_is_refused_naming_the_flag(bad):
    with pytest.raises(ValueError, match="--allowed-images"):
        parse_images(bad)


def test_the_shipped_lists_allow_the_shipped_images_and_the_gpu_toleration():
    """Without any setting the operator allows what it ships, and nothing else."""
    assert SHIPPED == Allowed(
        images=("ghcr.io/dsv4",),
        tolerations=("nvidia.com/gpu:NoSchedule",),
        device_resources=(
            "rdma/ib",
            "rdma/rdma_shared_device_a",
            "rdma/hca_shared_devices_a",
            "nvidia.com/hostdev",
        ),
    )
    args = parse_args(
        ["run", "--allowed-images", "ghcr.io/dsv4, lmsysorg/sglang:", "--allowed-tolerations", ""]
    )
    assert allowed_by(args).images == ("ghcr.io/dsv4", "lmsysorg/sglang:")
    assert allowed_by(args).tolerations == ()  # empty: none


def condition(world, kind):
    conditions = (world.obj().get("status") or {}).get("conditions") or []
    return next(c for c in conditions if c["type"] == kind)


@pytest.mark.parametrize(
    ("patch", "reason", "message"),
    [
        (
            {"router": {"image": "attacker.example/router:1"}},
            "ImageNotAllowed",
            "spec.router.image: attacker.example/router:1 is not an image the operator "
            "allows (allowedImages in ConfigMap dsv4-system/dsv4-operator-settings: "
            "ghcr.io/dsv4)",
        ),
        (
            {"image": {"name": "ghcr.io/dsv4-evil/engine:1"}},
            "ImageNotAllowed",
            "spec.image.name: ghcr.io/dsv4-evil/engine:1 is not an image",
        ),
        (
            {"placement": {"tolerations": [{"operator": "Exists"}]}},
            "TolerationNotAllowed",
            "spec.placement.tolerations[0]: the toleration * is not one the operator allows "
            "(allowedTolerations in ConfigMap dsv4-system/dsv4-operator-settings: "
            "nvidia.com/gpu:NoSchedule)",
        ),
        (
            {"placement": {"tolerations": [{"key": "pool", "value": "b", "effect": "NoSchedule"}]}},
            "TolerationNotAllowed",
            "spec.placement.tolerations[0]: the toleration pool=b:NoSchedule is not one",
        ),
        (
            {"decode": {"resources": {"rdma": {"resourceName": "devices.kubevirt.io/kvm"}}}},
            "DeviceNotAllowed",
            "spec.decode.resources.rdma.resourceName: devices.kubevirt.io/kvm is not a device "
            "resource the operator allows (allowedDeviceResources in ConfigMap "
            "dsv4-system/dsv4-operator-settings: rdma/ib, ",
        ),
        (
            {"placement": {"priorityClassName": "system-node-critical"}},
            "PriorityClassNotAllowed",
            "spec.placement.priorityClassName: system-node-critical is not a priority class "
            "the operator allows (allowedPriorityClasses in ConfigMap "
            "dsv4-system/dsv4-operator-settings: none)",
        ),
    ],
    ids=["router-image", "engine-image", "every-taint", "another-pool", "kvm-device", "priority"],
)
def test_a_deployment_outside_the_allow_lists_degrades_and_writes_nothing(patch, reason, message):
    world = World()
    world.create("flash", patch)
    world.step("flash")
    degraded = condition(world, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", reason)
    assert degraded["message"].startswith(message), degraded["message"]
    assert world.children("flash") == {}
    assert world.events(reason)


def test_an_allowed_router_image_and_toleration_are_rendered():
    world = World()
    world.create(
        "flash",
        {
            "router": {"image": "ghcr.io/dsv4/router:1"},
            "placement": {
                "tolerations": [
                    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                ]
            },
        },
    )
    world.step("flash")
    assert condition(world, "Degraded")["status"] == "False"
    router = world.children("flash")[("Deployment", "flash-router")]
    (container,) = router["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "ghcr.io/dsv4/router:1"


def test_the_gpu_toleration_the_operator_adds_is_judged_too():
    """An administrator who drops it from the list gets every deployment refused by the
    operator, saying why, rather than every engine write refused by the fence."""
    world = World()
    world.reconciler.allowed = replace(world.reconciler.allowed, tolerations=())
    world.create("flash")
    world.step("flash")
    degraded = condition(world, "Degraded")
    assert degraded["reason"] == "TolerationNotAllowed"
    assert degraded["message"].startswith(
        "the toleration of the GPU taint every engine pod gets: the toleration "
        "nvidia.com/gpu:NoSchedule is not one the operator allows"
    )


def test_an_allowed_priority_class_is_given_to_every_engine_pod_and_no_other():
    """The stable's and the canary's engine pods run at it; the router keeps the default."""
    world = World()
    world.reconciler.allowed = replace(world.reconciler.allowed, priority_classes=("inference",))
    world.create("flash", {"placement": {"priorityClassName": "inference"}})
    world.until("Ready", lambda: (world.obj().get("status") or {}).get("phase") == "Ready")
    world.patch_spec("flash", FP4)
    world.until("a canary", lambda: world.rollout().get("canaryRevision") is not None)
    templates = {
        (kind, name): obj["spec"]["template"]["spec"]
        for (kind, _, name), obj in world.api.objects.items()
        if kind in ("StatefulSet", "Deployment")
    }
    engines = {key for key in templates if key[0] == "StatefulSet"}
    assert {("StatefulSet", "flash--canary-prefill"), ("StatefulSet", "flash-decode")} <= engines
    for key, spec in templates.items():
        assert spec.get("priorityClassName") == ("inference" if key in engines else None), key


@pytest.mark.parametrize("bad", ["System-Node-Critical", "-x", "a b"])
def test_a_malformed_priority_class_entry_is_refused_naming_the_flag(bad):
    with pytest.raises(ValueError, match="--allowed-priority-classes"):
        parse_priority_classes(bad)
