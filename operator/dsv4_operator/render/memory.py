"""Engine pod memory: the user's request plus the HiCache host tier the role will pin.

HiCache keeps a host copy of the KV pools (ratio × the device pools, per GPU rank), so a
flag that turns it on must grow the pod's memory request and limit by exactly that, or the
engine is OOM-killed only once real traffic fills the tier.  The canary is rendered by the
same function, so a canary that fits proves the promoted pods fit.
"""

from __future__ import annotations

import math

from kubernetes.utils import parse_quantity

from dsv4_engine.configurator import ConfigError, EngineSettings, hicache_host_bytes
from dsv4_engine.features import Role
from dsv4_engine.presets import preset_config
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.render.engine import role_features

GIB = 1 << 30
# HBM per GPU as the engine sees it; a spec allowing several products is sized for the largest.
GPU_MEMORY_BYTES = {"NVIDIA-B200": 180 * GIB, "NVIDIA-GB200": 186 * GIB}
DEFAULT_GPU_MEMORY_BYTES = 180 * GIB


class MemorySizingError(ValueError):
    """HiCache host memory cannot be computed for this spec; the message names the field."""


def hicache_bytes_per_pod(spec: DSV4DeploymentSpec, role: Role) -> int:
    features = role_features(spec.features, role)
    if not features.hicache.enabled:
        return 0
    role_spec = spec.role_spec(role)
    gpu_memory = max(
        GPU_MEMORY_BYTES.get(p, DEFAULT_GPU_MEMORY_BYTES) for p in spec.placement.gpu_products
    )
    settings = EngineSettings(
        engine=spec.engine,
        index_dtype=features.index_dtype,
        tp_size=role_spec.tp,
        dp_size=role_spec.dp if role_spec.enable_dp_attention else 1,
        disaggregation_mode=role.value,
    )
    try:
        per_rank = hicache_host_bytes(
            preset_config(spec.model.preset.value),
            settings,
            gpu_memory_bytes=gpu_memory,
            ratio=features.hicache.ratio,
            size_gb=features.hicache.size_gb,
        )
    except ConfigError as err:
        raise MemorySizingError(f"spec.features.hicache ({role.value}): {err}") from None
    return per_rank * role_spec.gpus_per_node


def pod_memory(spec: DSV4DeploymentSpec, role: Role) -> str:
    """The memory request (= limit) of one engine pod of ``role``."""
    requested = spec.role_spec(role).resources.memory
    extra = hicache_bytes_per_pod(spec, role)
    if not extra:
        return requested
    total = int(parse_quantity(requested)) + extra
    return f"{math.ceil(total / (1 << 20))}Mi"
