"""The largest DSV4Deployment the API server admits (`dsv4_dev.largest`, what `make
bench-scale` creates eight of): it is at every bound of the spec, and the operator takes it
through a canary writing nothing the API server would refuse for its size (issue 62: the
review's 1.27 MB objects flapped Degraded on a 422, their annotations over 256 KiB)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dsv4_dev.largest import largest
from dsv4_engine.engine_config import Disaggregation
from dsv4_operator.api.spec import (
    MAX_ENV_CHARS,
    MAX_EXTRA_ARGS_CHARS,
    DSV4DeploymentSpec,
    PlacementSpec,
    RoleSpec,
)
from tests.unit.operator.harness import FP4, NS, World

pytestmark = pytest.mark.slow

# The API server's limits (k8s.io/apimachinery TotalAnnotationSizeLimitB; etcd's default
# request size, which bounds an object).
ANNOTATIONS_MAX = 256 * 1024
OBJECT_MAX = 1536 * 1024


def max_items(model: Any, field: str) -> int:
    (bound,) = [
        m.max_length for m in model.model_fields[field].metadata if hasattr(m, "max_length")
    ]
    return bound


def test_the_largest_spec_is_admitted_at_every_bound_it_fills():
    spec = DSV4DeploymentSpec.model_validate(largest(NS, "flash")["spec"])
    for role in (spec.prefill, spec.decode):
        assert sum(len(a) for a in role.extra_args) == MAX_EXTRA_ARGS_CHARS
        assert sum(len(e.name) + len(e.value) for e in role.env) == MAX_ENV_CHARS
        assert len(role.env) == max_items(RoleSpec, "env")
    placement = spec.placement
    assert len(placement.node_selector) == max_items(PlacementSpec, "node_selector")
    assert len(placement.gpu_products) == max_items(PlacementSpec, "gpu_products")
    assert {len(k) for k in placement.node_selector} == {317}
    assert len(spec.disaggregation.ib_devices) == max_items(Disaggregation, "ib_devices")


def annotations_size(obj: dict[str, Any]) -> int:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return sum(len(k) + len(v) for k, v in annotations.items())


def test_the_operator_takes_it_through_a_canary_within_the_api_servers_limits():
    world = World()
    world.create("flash", largest(NS, "flash")["spec"])
    world.until("Ready", lambda: (world.obj().get("status") or {}).get("phase") == "Ready")
    world.patch_spec("flash", FP4)
    world.until("a canary", lambda: world.rollout().get("canaryRevision") is not None)
    written = [w.body for w in world.api.log if w.body is not None]
    written += list(world.api.objects.values())
    assert max(annotations_size(obj) for obj in written) <= ANNOTATIONS_MAX
    assert max(len(json.dumps(obj)) for obj in written) <= OBJECT_MAX
    assert (world.obj().get("status") or {}).get("phase") != "Degraded"
