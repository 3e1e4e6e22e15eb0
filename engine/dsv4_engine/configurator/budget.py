"""From GPU memory to the KV budget of one rank: what SGLang has left for its pools.

SGLang gives the KV pools ``total * mem_fraction_static`` minus what the weights already
took.  The weights are measured at load time there; here they are estimated from the
config (routed experts in MXFP4 for DeepSeek-V4, fp8 elsewhere, bf16 embeddings) unless
the caller knows the real figure.  The estimate is labelled as such wherever it is shown.
"""

from __future__ import annotations

from dsv4_engine.configurator.errors import ConfigError
from dsv4_engine.configurator.model import ModelKind, ModelSpec
from dsv4_engine.configurator.settings import EngineSettings

GiB = 1 << 30
DEFAULT_MEM_FRACTION_STATIC = 0.9
MXFP4_BYTES_PER_PARAM = 0.5 + 1 / 32  # e2m1 pairs plus one e8m0 scale per 32 values
FP8_BYTES_PER_PARAM = 1 + 4 / (128 * 128)  # one fp32 scale per 128x128 block
BF16_BYTES_PER_PARAM = 2


def estimate_weight_bytes_per_rank(model: ModelSpec, settings: EngineSettings) -> int:
    """Approximate checkpoint bytes one rank holds when experts, heads and vocabulary are
    split over ``tp_size`` ranks."""
    h = model.hidden_size
    expert = 3 * h * model.moe_intermediate_size
    embeddings = 2 * model.vocab_size * h * BF16_BYTES_PER_PARAM
    if model.kind is ModelKind.DSV4:
        heads_dim = model.num_attention_heads * (model.qk_nope_head_dim + model.qk_rope_head_dim)
        attn = (
            h * model.q_lora_rank
            + model.q_lora_rank * heads_dim
            + h * (model.qk_nope_head_dim + model.qk_rope_head_dim)
            + heads_dim * model.o_lora_rank
            + model.o_lora_rank * h
        )
        routed = model.n_routed_experts * expert * MXFP4_BYTES_PER_PARAM
        per_layer = routed + (model.n_shared_experts * expert + attn) * FP8_BYTES_PER_PARAM
        total = model.num_layers * per_layer + embeddings
    else:
        heads = model.num_attention_heads
        attn = (
            h * model.q_lora_rank
            + model.q_lora_rank * heads * (model.qk_nope_head_dim + model.qk_rope_head_dim)
            + h * (model.kv_lora_rank + model.qk_rope_head_dim)
            + model.kv_lora_rank * heads * 2 * model.qk_nope_head_dim
            + heads * model.qk_nope_head_dim * h
        )
        moe_layers = model.num_layers - model.first_k_dense_replace
        moe = (model.n_routed_experts + model.n_shared_experts) * expert
        dense = 3 * h * model.intermediate_size
        params = model.num_layers * attn + moe_layers * moe + model.first_k_dense_replace * dense
        total = params * FP8_BYTES_PER_PARAM + embeddings
    return int(total / settings.tp_size)


def kv_budget_bytes(
    gpu_memory_bytes: int,
    weight_bytes_per_rank: int,
    mem_fraction_static: float = DEFAULT_MEM_FRACTION_STATIC,
) -> int:
    """Bytes left for KV pools on one GPU."""
    if not 0 < mem_fraction_static <= 1:
        raise ConfigError(
            f"mem_fraction_static: expected a value in (0, 1], got {mem_fraction_static}"
        )
    if gpu_memory_bytes <= 0:
        raise ConfigError(f"gpu_memory: expected a positive size, got {gpu_memory_bytes} bytes")
    budget = int(gpu_memory_bytes * mem_fraction_static) - weight_bytes_per_rank
    if budget <= 0:
        raise ConfigError(
            f"gpu_memory: {gpu_memory_bytes / GiB:.1f} GiB x mem_fraction_static "
            f"{mem_fraction_static} does not cover the weights ({weight_bytes_per_rank / GiB:.1f} GiB "
            f"per rank); no memory is left for the KV pools"
        )
    return budget
