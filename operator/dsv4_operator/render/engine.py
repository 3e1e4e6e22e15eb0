"""The engine ConfigMap: one `engine.yaml` per role, and the hash that rolls its pods."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Any

from dsv4_engine.engine_config import EngineConfig, MultiNode, dump_engine_yaml
from dsv4_engine.features import EngineFeatures, HiCacheFeature, Role
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.render.meta import Owner, Slot, metadata

ENGINE_PORT = 30000
DIST_INIT_PORT = 5000
MODEL_MOUNT = "/models"
CONFIG_HASH_IN_NAME = 10


def role_name(owner: Owner, role: Role, slot: Slot = Slot.BLUE) -> str:
    return f"{owner.name}-{role.value}{slot.suffix}"


def config_map_name(owner: Owner, role: Role, config_hash: str, slot: Slot = Slot.BLUE) -> str:
    """One ConfigMap per role and configuration: the name carries the configuration's
    hash, so a pod restarted mid-rollout mounts exactly the `engine.yaml` its template was
    rendered with, never a newer one it was not sized for."""
    return f"{role_name(owner, role, slot)}-engine-{config_hash[:CONFIG_HASH_IN_NAME]}"


def model_path(spec: DSV4DeploymentSpec) -> str:
    pvc = spec.model.pvc
    sub = pvc.path.strip("/") if pvc is not None else ""
    return f"{MODEL_MOUNT}/{sub}" if sub else MODEL_MOUNT


def role_features(features: EngineFeatures, role: Role) -> EngineFeatures:
    """The flags as one role sees them: HiCache off where it does not apply, so turning it
    on for decode leaves prefill's engine.yaml (and its pods) untouched."""
    if features.hicache.enabled and role not in features.hicache.roles:
        return features.model_copy(update={"hicache": HiCacheFeature()})
    return features


def engine_config(spec: DSV4DeploymentSpec, role: Role) -> EngineConfig:
    role_spec = spec.role_spec(role)
    multinode = None
    if role_spec.nodes_per_replica > 1:
        multinode = MultiNode(nnodes=role_spec.nodes_per_replica, dist_init_port=DIST_INIT_PORT)
    return EngineConfig(
        role=role,
        backend=spec.engine,
        reference_model=spec.model.reference_model,
        model_path=model_path(spec),
        served_model_name=spec.model.served_model_name,
        tool_call_parser=spec.model.tool_call_parser,
        tp=role_spec.tp,
        dp=role_spec.dp,
        ep=role_spec.ep,
        enable_dp_attention=role_spec.enable_dp_attention,
        multinode=multinode,
        disaggregation=spec.disaggregation,
        features=role_features(spec.features, role),
        extra_args=role_spec.extra_args,
        max_total_tokens=role_spec.max_total_tokens,
        port=ENGINE_PORT,
    )


RENDERED_MAX = 2048  # engine.yaml texts kept: two roles of ~1,000 deployments' revisions
_rendered: OrderedDict[tuple[str, Role], str] = OrderedDict()
_rendered_lock = threading.Lock()


def engine_yaml(spec: DSV4DeploymentSpec, role: Role) -> str:
    """The role's `engine.yaml` text, rendered once per spec: a deployment's every pass
    renders its children to compare them with the live ones, and the YAML dump was the
    largest part of a pass's own CPU at 500 deployments (`make bench-scale`).  Keyed by the
    spec's JSON, so an edit of any field renders anew; byte-equal to rendering it again
    (`tests/unit/operator/test_op_render.py`)."""
    key = (spec.model_dump_json(), role)
    with _rendered_lock:
        text = _rendered.get(key)
        if text is not None:
            _rendered.move_to_end(key)
            return text
    text = dump_engine_yaml(engine_config(spec, role))
    with _rendered_lock:
        _rendered[key] = text
        while len(_rendered) > RENDERED_MAX:
            _rendered.popitem(last=False)
    return text


def short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def config_map(owner: Owner, role: Role, text: str, slot: Slot = Slot.BLUE) -> dict[str, Any]:
    """One role's `engine.yaml`, immutable: a new configuration is a new ConfigMap."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(
            owner, config_map_name(owner, role, short_hash(text), slot), "engine-config"
        ),
        "immutable": True,
        "data": {f"{role.value}.yaml": text},
    }
