"""Spec → Kubernetes objects, as pure functions (no I/O): what a DSV4Deployment should own."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dsv4_engine.features import Role
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.render.engine import config_map, engine_yaml, short_hash
from dsv4_operator.render.memory import pod_memory
from dsv4_operator.render.meta import Owner, Slot
from dsv4_operator.render.network import engine_network_policy
from dsv4_operator.render.router import router_deployment, router_shared
from dsv4_operator.render.transfer import transfer_key
from dsv4_operator.render.workloads import HostMemory, role_objects


def render_slot(
    owner: Owner,
    spec: DSV4DeploymentSpec,
    slot: Slot = Slot.BLUE,
    host_memory: HostMemory = pod_memory,
    by_role: Mapping[Role, DSV4DeploymentSpec] | None = None,
    router: bool = True,
) -> list[dict[str, Any]]:
    """The engine objects of one slot, and its router when ``router``, in apply order (the
    ConfigMap before the pods that mount it).

    Each role's pod template carries the hash of that role's own `engine.yaml`, so a flag
    change rolls exactly the roles whose engine configuration changed.  ``by_role`` gives a
    role its own spec: during a role-by-role promotion one role already runs the new flags
    while the other still runs the stable ones (flags of one transfer format, always).
    """
    role_spec = by_role or {role: spec for role in Role}
    yamls = {role: engine_yaml(role_spec[role], role) for role in Role}
    transfer = transfer_key(spec)
    objects = []
    for role in Role:
        config_hash = short_hash(yamls[role])
        objects.append(config_map(owner, role, yamls[role], slot))
        objects += role_objects(
            owner, role_spec[role], role, config_hash, host_memory, slot, transfer
        )
    if router and spec.router.replicas:
        objects.append(router_deployment(owner, spec, slot, transfer))
    return objects


def render_all(
    owner: Owner,
    spec: DSV4DeploymentSpec,
    host_memory: HostMemory = pod_memory,
    by_role: Mapping[Role, DSV4DeploymentSpec] | None = None,
) -> list[dict[str, Any]]:
    """Every child of a deployment whose engines live in one slot (`blue`): what a new
    deployment and the canary slice consist of."""
    return render_slot(owner, spec, Slot.BLUE, host_memory, by_role) + shared(owner)


def shared(owner: Owner) -> list[dict[str, Any]]:
    """What a slice has once, whatever its slots: its routers' identity and Service, and
    the NetworkPolicy of its engines."""
    return [*router_shared(owner), engine_network_policy(owner)]
