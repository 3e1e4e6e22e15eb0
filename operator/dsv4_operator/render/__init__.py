"""Spec → Kubernetes objects, as pure functions (no I/O): what a DSV4Deployment should own."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dsv4_engine.engine_config import dump_engine_yaml
from dsv4_engine.features import Role
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.render.engine import config_map, engine_config, short_hash
from dsv4_operator.render.memory import pod_memory
from dsv4_operator.render.meta import Owner
from dsv4_operator.render.router import router_objects
from dsv4_operator.render.workloads import HostMemory, role_objects


def render_all(
    owner: Owner,
    spec: DSV4DeploymentSpec,
    host_memory: HostMemory = pod_memory,
    by_role: Mapping[Role, DSV4DeploymentSpec] | None = None,
) -> list[dict[str, Any]]:
    """Every child object, in apply order (the ConfigMap before the pods that mount it).

    Each role's pod template carries the hash of that role's own `engine.yaml`, so a flag
    change rolls exactly the roles whose engine configuration changed.  ``by_role`` gives a
    role its own spec: during a promotion one role already runs the new flags while the
    other still runs the stable ones.
    """
    role_spec = by_role or {role: spec for role in Role}
    yamls = {role: dump_engine_yaml(engine_config(owner, role_spec[role], role)) for role in Role}
    objects = [config_map(owner, yamls)]
    for role in Role:
        objects += role_objects(owner, role_spec[role], role, short_hash(yamls[role]), host_memory)
    return objects + router_objects(owner, spec)
