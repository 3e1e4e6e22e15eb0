"""Entry points: a pool plan from a model and settings, and what the legacy bug costs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from dsv4_engine.configurator.budget import (
    DEFAULT_MEM_FRACTION_STATIC,
    estimate_weight_bytes_per_rank,
    kv_budget_bytes,
)
from dsv4_engine.configurator.dsa import plan_dsa
from dsv4_engine.configurator.dsv4 import plan_dsv4
from dsv4_engine.configurator.errors import ConfigError
from dsv4_engine.configurator.hicache import host_bytes_for_plan, host_bytes_for_size
from dsv4_engine.configurator.model import ModelKind, ModelSpec, model_spec_from_hf_config
from dsv4_engine.configurator.result import PoolPlan
from dsv4_engine.configurator.settings import EngineSettings


def plan_pools(model: ModelSpec, settings: EngineSettings, kv_budget_bytes: int) -> PoolPlan:
    """Pool sizes of one rank given the bytes left for KV pools."""
    if model.kind is ModelKind.DSV4:
        return plan_dsv4(model, settings, kv_budget_bytes)
    return plan_dsa(model, settings, kv_budget_bytes)


@dataclass(frozen=True)
class LegacyComparison:
    """The seed's bf16 formula against the fixed one on the same budget."""

    fixed: PoolPlan
    legacy: PoolPlan

    @property
    def over_reserved_bytes(self) -> int:
        """Bytes the legacy coefficient budgets for index-K that the pools never allocate,
        at the legacy plan's token count."""
        extra = self.legacy.bytes_per_full_token - self.fixed.bytes_per_full_token
        return int(self.legacy.full_tokens * extra)

    @property
    def tokens_lost(self) -> int:
        return self.fixed.full_tokens - self.legacy.full_tokens


def compare_legacy(
    model: ModelSpec, settings: EngineSettings, kv_budget_bytes: int
) -> LegacyComparison:
    return LegacyComparison(
        fixed=plan_pools(model, replace(settings, legacy=False), kv_budget_bytes),
        legacy=plan_pools(model, replace(settings, legacy=True), kv_budget_bytes),
    )


@dataclass(frozen=True)
class GpuBudget:
    gpu_memory_bytes: int
    mem_fraction_static: float
    weight_bytes_per_rank: int
    weights_estimated: bool
    kv_budget_bytes: int


def gpu_budget(
    model: ModelSpec,
    settings: EngineSettings,
    gpu_memory_bytes: int,
    *,
    mem_fraction_static: float = DEFAULT_MEM_FRACTION_STATIC,
    weight_bytes_per_rank: int | None = None,
) -> GpuBudget:
    estimated = weight_bytes_per_rank is None
    weights = (
        estimate_weight_bytes_per_rank(model, settings) if estimated else weight_bytes_per_rank
    )
    return GpuBudget(
        gpu_memory_bytes=gpu_memory_bytes,
        mem_fraction_static=mem_fraction_static,
        weight_bytes_per_rank=weights,
        weights_estimated=estimated,
        kv_budget_bytes=kv_budget_bytes(gpu_memory_bytes, weights, mem_fraction_static),
    )


def plan_for_gpu(
    hf_config: Mapping[str, Any],
    settings: EngineSettings,
    gpu_memory_bytes: int,
    *,
    mem_fraction_static: float = DEFAULT_MEM_FRACTION_STATIC,
    weight_bytes_per_rank: int | None = None,
) -> PoolPlan:
    """One call from a config dict and a GPU size to the rank's pool plan."""
    model = model_spec_from_hf_config(hf_config)
    budget = gpu_budget(
        model,
        settings,
        gpu_memory_bytes,
        mem_fraction_static=mem_fraction_static,
        weight_bytes_per_rank=weight_bytes_per_rank,
    )
    return plan_pools(model, settings, budget.kv_budget_bytes)


def hicache_host_bytes(
    hf_config: Mapping[str, Any],
    settings: EngineSettings,
    *,
    gpu_memory_bytes: int,
    ratio: float | None = None,
    size_gb: float | None = None,
    mem_fraction_static: float = DEFAULT_MEM_FRACTION_STATIC,
    weight_bytes_per_rank: int | None = None,
) -> int:
    """Host (CPU) bytes one rank's HiCache tier takes, for a ratio of the device pools or
    an explicit size in GiB per rank; multiply by the ranks in a pod for its memory."""
    if size_gb is not None:
        return host_bytes_for_size(size_gb)
    if ratio is None:
        raise ConfigError(
            "hicache: give a ratio (host pool as a multiple of the device pool) or a size"
        )
    # plan_for_gpu's two steps on the one parsed model the host mirror needs too.
    model = model_spec_from_hf_config(hf_config)
    budget = gpu_budget(
        model,
        settings,
        gpu_memory_bytes,
        mem_fraction_static=mem_fraction_static,
        weight_bytes_per_rank=weight_bytes_per_rank,
    )
    plan = plan_pools(model, settings, budget.kv_budget_bytes)
    return host_bytes_for_plan(model, settings, plan, ratio)
