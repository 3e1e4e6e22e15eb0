"""The two slices a rollout renders: the stable workloads and the canary (pure functions).

Both are ordinary renderings of the spec with other flags: the canary is the same
deployment under the name `<name>--canary`, with the flags under test and a small replica
count; the stable slice gets, role by role, the flags the rollout state says it runs.
"""

from __future__ import annotations

from typing import Any

from dsv4_engine.features import Role
from dsv4_operator.api.names import CANARY_SUFFIX
from dsv4_operator.api.rollout import CanarySpec, FlagSet, RolloutStatus
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.render import render_all
from dsv4_operator.render.meta import Owner
from dsv4_operator.render.router import ROUTER_PORT, router_name
from dsv4_operator.render.workloads import HostMemory

SLICE_LABEL = "inference.dsv4.dev/slice"


def spec_flags(spec: DSV4DeploymentSpec) -> FlagSet:
    """The flags the spec asks for: what a rollout moves production towards."""
    return FlagSet(features=spec.features, image=spec.image.name)


def with_flags(spec: DSV4DeploymentSpec, flags: FlagSet) -> DSV4DeploymentSpec:
    image = spec.image.model_copy(update={"name": flags.image})
    return spec.model_copy(update={"features": flags.features, "image": image})


def canary_owner(owner: Owner) -> Owner:
    return Owner(name=f"{owner.name}{CANARY_SUFFIX}", namespace=owner.namespace, uid=owner.uid)


def canary_spec(spec: DSV4DeploymentSpec, flags: FlagSet, canary: CanarySpec) -> DSV4DeploymentSpec:
    flagged = with_flags(spec, flags)
    return flagged.model_copy(
        update={
            "prefill": flagged.prefill.model_copy(update={"replicas": canary.prefill_replicas}),
            "decode": flagged.decode.model_copy(update={"replicas": canary.decode_replicas}),
            "router": flagged.router.model_copy(update={"replicas": 1}),
        }
    )


def as_canary(owner: Owner, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Canary objects belong to the real DSV4Deployment (garbage-collected with it) and say
    which slice they are, so the stable reconcile never mistakes them for its own orphans."""
    out = []
    for obj in objects:
        meta = dict(obj["metadata"])
        meta["labels"] = {**meta.get("labels", {}), SLICE_LABEL: "canary"}
        meta["ownerReferences"] = [
            {**ref, "name": owner.name} for ref in meta.get("ownerReferences", [])
        ]
        out.append({**obj, "metadata": meta})
    return out


def canary_objects(
    owner: Owner, spec: DSV4DeploymentSpec, status: RolloutStatus, host_memory: HostMemory
) -> list[dict[str, Any]]:
    """The canary slice for ``status``'s canary flags (owned by the real resource)."""
    if status.canary is None:
        return []
    cspec = canary_spec(spec, status.canary, spec.canary)
    return as_canary(owner, render_all(canary_owner(owner), cspec, host_memory))


def role_specs(
    spec: DSV4DeploymentSpec, flags_of: dict[Role, FlagSet]
) -> dict[Role, DSV4DeploymentSpec]:
    return {role: with_flags(spec, flags_of[role]) for role in Role}


def canary_url(owner: Owner) -> tuple[str, int]:
    """(Service name, port) of the canary's router: the probes' target."""
    return router_name(canary_owner(owner)), ROUTER_PORT
