"""Spec → Kubernetes objects, as pure functions (no I/O): what a DSV4Deployment should own."""

from __future__ import annotations

from typing import Any

from dsv4_engine.features import Role
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.render.engine import config_map, engine_yamls, short_hash
from dsv4_operator.render.meta import Owner
from dsv4_operator.render.router import router_objects
from dsv4_operator.render.workloads import HostMemory, requested_memory, role_objects


def render_all(
    owner: Owner, spec: DSV4DeploymentSpec, host_memory: HostMemory = requested_memory
) -> list[dict[str, Any]]:
    """Every child object, in apply order (the ConfigMap before the pods that mount it).

    Each role's pod template carries the hash of that role's own `engine.yaml`, so a flag
    change rolls exactly the roles whose engine configuration changed.
    """
    yamls = engine_yamls(owner, spec)
    objects = [config_map(owner, yamls)]
    for role in Role:
        objects += role_objects(owner, spec, role, short_hash(yamls[role]), host_memory)
    return objects + router_objects(owner, spec)
