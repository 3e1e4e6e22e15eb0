"""DSA (DeepSeek-V3.2-style) pool sizing: SGLang 0.5.23's ``DefaultPoolConfigurator``.

One pool of MLA latents plus the lightning indexer's keys, both per token: the cell size
is the latent row times the layers plus the index-K row times the indexer layers, and
tokens are ``budget // cell`` rounded down to a page.  The index-K term is the DSA
indexer cell size, the first of the two places the seed's bf16 bug sat.
"""

from __future__ import annotations

from dsv4_engine.configurator.budget import GiB
from dsv4_engine.configurator.errors import ConfigError
from dsv4_engine.configurator.index_budget import (
    BF16_ELEMENT_BYTES,
    index_k_budget_bytes,
    index_k_storage,
    stored_index_k_bytes,
)
from dsv4_engine.configurator.model import ModelSpec
from dsv4_engine.configurator.result import Pool, PoolPlan
from dsv4_engine.configurator.settings import EngineSettings
from dsv4_engine.features import IndexDtype

# The MTP (NextN) draft of DeepSeek-V3.x has one layer.
DRAFT_LAYERS = 1
# The scaled FlashMLA latent: one fp32 scale per this many fp8 values.
LATENT_FP8_BLOCK = 128


def latent_bytes_per_token(model: ModelSpec, settings: EngineSettings) -> int:
    """One layer's MLA latent row: fp8 latent with one fp32 scale per 128 values and a
    bf16 rope part (the scaled FlashMLA layout), or plain bf16."""
    if settings.kv_cache_dtype == "fp8_e4m3":
        if model.kv_lora_rank % LATENT_FP8_BLOCK:
            raise ConfigError(
                f"model config: kv_lora_rank {model.kv_lora_rank} must be a multiple of "
                f"{LATENT_FP8_BLOCK} for the fp8 KV cache"
            )
        return (
            model.kv_lora_rank
            + model.kv_lora_rank // LATENT_FP8_BLOCK * 4
            + model.qk_rope_head_dim * 2
        )
    return (model.kv_lora_rank + model.qk_rope_head_dim) * 2


def indexer_bytes_per_token_layer(model: ModelSpec, settings: EngineSettings) -> int:
    """Index-K bytes per token and indexer layer, split over ``index_kpool`` pooled keys,
    at the size the sizing budgets (fp4 as DSV4's)."""
    kpool = model.index_kpool
    if settings.legacy and settings.index_dtype is IndexDtype.BF16:
        # The fork priced bf16 as ceil(fp8 row / kpool) elements of 2 bytes (rounded per
        # pooled key before doubling, so not the legacy row split over kpool).
        fp8 = stored_index_k_bytes(model.index_head_dim, IndexDtype.FP8)
        return -(-fp8 // kpool) * BF16_ELEMENT_BYTES
    return -(-index_k_budget_bytes(model.index_head_dim, settings) // kpool)


def plan_dsa(model: ModelSpec, settings: EngineSettings, kv_budget_bytes: int) -> PoolPlan:
    page = settings.page_size
    latent = latent_bytes_per_token(model, settings)
    index_k = indexer_bytes_per_token_layer(model, settings)
    kv_cell = latent * model.num_layers
    index_cell = index_k * model.indexer_layers
    cell = kv_cell + index_cell
    draft_cell = 0
    if settings.speculative:
        # The draft shares the target's per-layer latent size and indexes every layer.
        draft_cell = int(kv_cell * DRAFT_LAYERS / model.num_layers) + index_k * DRAFT_LAYERS
    cell += draft_cell
    tokens = kv_budget_bytes // cell // page * page
    if tokens <= 0:
        raise ConfigError(
            f"memory: {kv_budget_bytes / GiB:.3f} GiB per rank is less than one "
            f"{page}-token page at {cell} bytes per token"
        )
    pools = [Pool("kv", kv_cell, tokens), Pool("indexer", index_cell, tokens)]
    if draft_cell:
        pools.append(Pool("draft", draft_cell, tokens))
    return PoolPlan(
        model_kind=model.kind.value,
        index_dtype=settings.index_dtype.value,
        engine=settings.engine.value,
        index_k_storage=index_k_storage(model.index_head_dim, settings),
        legacy=settings.legacy,
        page_size=page,
        kv_budget_bytes=kv_budget_bytes,
        bytes_per_full_token=float(cell),
        fixed_bytes=0,
        full_tokens=tokens,
        max_running_requests_per_worker=settings.max_running_requests_per_worker or 0,
        index_k_budget_bytes=index_k,
        index_k_alloc_bytes=stored_index_k_bytes(model.index_head_dim, settings.index_dtype),
        swa_mode="none",
        pools=tuple(pools),
    )
