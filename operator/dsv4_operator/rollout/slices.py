"""The two slices a rollout renders: the stable workloads and the canary (pure functions).

Both are ordinary renderings of the spec with other flags: the canary is the same
deployment under the name `<name>--canary`, with the flags under test and a small replica
count; the stable slice gets, role by role, the flags the rollout state says it runs.
"""

from __future__ import annotations

from typing import Any

from dsv4_engine.features import KvCanary, Role
from dsv4_operator.api.names import CANARY_SUFFIX
from dsv4_operator.api.rollout import CanarySpec, EngineRevision, RolloutStatus
from dsv4_operator.api.rolls import Rolls, classes, overlay, project
from dsv4_operator.api.spec import REVISION_ADMITTED, DSV4DeploymentSpec, RoleSpec
from dsv4_operator.render import render_all
from dsv4_operator.render.meta import LABEL_COMPONENT, WORKLOAD_KINDS, Owner
from dsv4_operator.render.router import COMPONENT as ROUTER_COMPONENT
from dsv4_operator.render.router import ROUTER_PORT, router_name
from dsv4_operator.render.transfer import transfer_key
from dsv4_operator.render.workloads import HostMemory

SLICE_LABEL = "inference.dsv4.dev/slice"


REVISION_PATHS = [
    path for path, rolls in classes(DSV4DeploymentSpec).items() if rolls is Rolls.REVISION
]


def spec_revision(spec: DSV4DeploymentSpec) -> EngineRevision:
    """The engine revision the spec asks for: what a rollout moves production towards."""
    data = spec.model_dump(mode="json", by_alias=True)
    return EngineRevision(spec=project(data, REVISION_PATHS), transfer_key=transfer_key(spec))


def with_revision(spec: DSV4DeploymentSpec, revision: EngineRevision) -> DSV4DeploymentSpec:
    """``spec`` with ``revision``'s engine fields: every other field (replicas, placement,
    the rollout's own settings) stays the live spec's.  Both were admitted, so known issues
    are not judged again (`REVISION_ADMITTED`): a stable revision acknowledged once keeps
    running while the live spec moves to flags that no longer need the acknowledgement."""
    data = spec.model_dump(mode="json", by_alias=True)
    return DSV4DeploymentSpec.model_validate(
        overlay(data, revision.spec, REVISION_PATHS), context={REVISION_ADMITTED: True}
    )


def canary_owner(owner: Owner) -> Owner:
    return Owner(name=f"{owner.name}{CANARY_SUFFIX}", namespace=owner.namespace, uid=owner.uid)


def canary_spec(
    spec: DSV4DeploymentSpec, flags: EngineRevision, canary: CanarySpec
) -> DSV4DeploymentSpec:
    """The canary's deployment: ``flags`` at the canary's replica counts, and SGLang's
    kv-canary in log mode whatever ``flags`` say, so every violation its engines find is
    logged and counted for the probe (`dsv4_engine.kv_canary`) while they keep serving:
    off it finds nothing, and raise would stop the engine before the probe could read it.
    Its HiCache roles run a device pool of `CanarySpec.pool_tokens`: the probe's prompts
    outgrow it, so prefixes are evicted to the host tier and read back (the path HiCache
    changes), which a PASS needs; production never runs the cap."""
    flagged = with_revision(spec, flags)
    features = flagged.features.model_copy(update={"kv_canary": KvCanary.LOG})
    hicache = features.hicache
    cap = canary.pool_tokens(spec.engine)

    def role(role: Role, replicas: int) -> RoleSpec:
        update: dict[str, Any] = {"replicas": replicas}
        if hicache.enabled and role in hicache.roles:
            update["max_total_tokens"] = cap
        return flagged.role_spec(role).model_copy(update=update)

    return flagged.model_copy(
        update={
            "features": features,
            "prefill": role(Role.PREFILL, canary.prefill_replicas),
            "decode": role(Role.DECODE, canary.decode_replicas),
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
    spec: DSV4DeploymentSpec, flags_of: dict[Role, EngineRevision]
) -> dict[Role, DSV4DeploymentSpec]:
    return {role: with_revision(spec, flags_of[role]) for role in Role}


def canary_url(owner: Owner) -> tuple[str, int]:
    """(Service name, port) of the canary's router: the probes' target."""
    return router_name(canary_owner(owner)), ROUTER_PORT


def pinned(objects: list[dict[str, Any]], runs: dict[Role, EngineRevision]) -> list[dict[str, Any]]:
    """Production runs the build its canary proved: each role's engine containers, and a
    router that runs the engine image, get their revision's digest in place of its tag."""
    out = []
    for obj in objects:
        component = (obj["metadata"].get("labels") or {}).get(LABEL_COMPONENT)
        role = (
            Role.DECODE
            if component == ROUTER_COMPONENT
            else Role(component)
            if component in tuple(Role)
            else None
        )
        revision = runs.get(role) if role is not None else None
        if obj["kind"] not in WORKLOAD_KINDS or revision is None or revision.image_digest is None:
            out.append(obj)
            continue
        out.append(_with_image(obj, revision.image, revision.image_digest))
    return out


def _with_image(node: Any, tag: str, digest: str) -> Any:
    """A copy of ``node`` whose containers running ``tag`` run ``digest`` instead."""
    if isinstance(node, list):
        return [_with_image(item, tag, digest) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _with_image(value, tag, digest) for key, value in node.items()}
    if "name" in out and out.get("image") == tag:
        out["image"] = digest
    return out
