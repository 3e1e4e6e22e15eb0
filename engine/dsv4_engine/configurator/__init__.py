"""KV-pool sizing for DeepSeek-V4 and DSA models, right for every index-K dtype.

Pure Python (no torch): the operator and ``dsv4ctl plan`` import it.  It models what
SGLang 0.5.23's pool configurators compute, so that for the fp8 index-K its numbers equal
SGLang's own (tests/sglang checks this against the real classes), and it prices bf16 and
fp4 index keys with their real sizes.  The bytes of one key are the one rule of
``dsv4_engine.index_k``; an index-K dtype SGLang does not store (bf16) is refused unless
the plan is for the reference engine (``engine=Backend.REFERENCE``).  ``legacy=True``
reproduces the seed's bf16 bug (its SGLang fork stored bf16 and priced it wrong).

Public API:
    model_spec_from_hf_config(cfg) -> ModelSpec        load_hf_config(path) -> dict
    EngineSettings(...)                                 index_k_bytes_per_token(dtype, d)
    plan_pools(model, settings, kv_budget_bytes) -> PoolPlan
    plan_for_gpu(cfg, settings, gpu_memory_bytes, mem_fraction_static=, weight_bytes_per_rank=)
    gpu_budget(model, settings, gpu_memory_bytes, ...) -> GpuBudget
    compare_legacy(model, settings, kv_budget_bytes) -> LegacyComparison
    hicache_host_bytes(cfg, settings, gpu_memory_bytes=, ratio=|size_gb=, ...) -> int
    host_bytes_for_plan(model, settings, plan, ratio) -> int
"""

from dsv4_engine.configurator.budget import (
    DEFAULT_MEM_FRACTION_STATIC,
    GiB,
    estimate_weight_bytes_per_rank,
    kv_budget_bytes,
)
from dsv4_engine.configurator.errors import ConfigError
from dsv4_engine.configurator.hicache import host_bytes_for_plan, host_bytes_for_size
from dsv4_engine.configurator.model import (
    ModelKind,
    ModelSpec,
    load_hf_config,
    model_spec_from_hf_config,
)
from dsv4_engine.configurator.plan import (
    GpuBudget,
    LegacyComparison,
    compare_legacy,
    gpu_budget,
    hicache_host_bytes,
    plan_for_gpu,
    plan_pools,
)
from dsv4_engine.configurator.result import Pool, PoolPlan
from dsv4_engine.configurator.settings import EngineSettings
from dsv4_engine.index_k import index_k_bytes_per_token

__all__ = [
    "DEFAULT_MEM_FRACTION_STATIC",
    "ConfigError",
    "EngineSettings",
    "GiB",
    "GpuBudget",
    "LegacyComparison",
    "ModelKind",
    "ModelSpec",
    "Pool",
    "PoolPlan",
    "compare_legacy",
    "estimate_weight_bytes_per_rank",
    "gpu_budget",
    "hicache_host_bytes",
    "host_bytes_for_plan",
    "host_bytes_for_size",
    "index_k_bytes_per_token",
    "kv_budget_bytes",
    "load_hf_config",
    "model_spec_from_hf_config",
    "plan_for_gpu",
    "plan_pools",
]
