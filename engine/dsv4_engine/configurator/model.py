"""What the pool sizing needs to know about a model, read from its Hugging Face config.

Two families are sized: DeepSeek-V4 (compressed attention: SWA, c4 with a lightning
indexer, c128) and DeepSeek-V3.2-style DSA models (MLA latent KV plus one indexer key per
token and layer).  Anything else is refused by name rather than sized wrongly.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from dsv4_engine.configurator.errors import ConfigError


class ModelKind(StrEnum):
    DSV4 = "deepseek_v4"
    DSA = "deepseek_dsa"


# Architectures SGLang 0.5.23 routes to the DSV4 pool configurator / treats as DSA
# (`is_deepseek_v4` / `is_deepseek_dsa` in srt/configs/model_config.py).
DSV4_ARCHITECTURES = frozenset(
    {"DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN", "DeepseekV4ForCausalLMDSpark"}
)
DSA_ARCHITECTURES = frozenset(
    {"DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLMNextN"}
)
SUPPORTED_COMPRESS_RATIOS = frozenset({0, 4, 128})


@dataclass(frozen=True)
class ModelSpec:
    """The dimensions pool sizing depends on; nothing else of the config."""

    kind: ModelKind
    architecture: str
    model_type: str
    num_layers: int
    qk_rope_head_dim: int
    index_head_dim: int
    # DeepSeek-V4 only.
    qk_nope_head_dim: int = 0
    sliding_window: int = 0
    compress_ratios: tuple[int, ...] = ()
    # DSA only.
    kv_lora_rank: int = 0
    index_kpool: int = 1
    indexer_layers: int = 0
    # For the weight-memory estimate of `budget.py`.
    hidden_size: int = 0
    vocab_size: int = 0
    num_attention_heads: int = 0
    q_lora_rank: int = 0
    o_lora_rank: int = 0
    n_routed_experts: int = 0
    n_shared_experts: int = 0
    moe_intermediate_size: int = 0
    intermediate_size: int = 0
    first_k_dense_replace: int = 0

    @property
    def attn_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def layers_with_ratio(self, ratio: int) -> int:
        return sum(1 for r in self.compress_ratios if r == ratio)


def load_hf_config(path: str | Path) -> dict[str, Any]:
    """Read a config.json, turning every failure into one line naming the file."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ConfigError(f"model config {p}: file not found") from None
    except OSError as err:
        raise ConfigError(f"model config {p}: cannot read ({err.strerror})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(
            f"model config {p}: not valid JSON ({err.msg}, line {err.lineno})"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"model config {p}: expected a JSON object, got {type(data).__name__}")
    return data


def _int(cfg: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        if value is None:
            raise ConfigError(f"model config: missing field {key!r}")
        raise ConfigError(
            f"model config: field {key!r} must be a non-negative integer, got {value!r}"
        )
    return value


def _architecture(cfg: Mapping[str, Any]) -> str:
    archs = cfg.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise ConfigError("model config: field 'architectures' must be a non-empty list of names")
    return archs[0]


def _common(cfg: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "model_type": str(cfg.get("model_type", "")),
        "num_layers": _int(cfg, "num_hidden_layers"),
        "qk_rope_head_dim": _int(cfg, "qk_rope_head_dim"),
        "index_head_dim": _int(cfg, "index_head_dim"),
        "hidden_size": _int(cfg, "hidden_size", 0),
        "vocab_size": _int(cfg, "vocab_size", 0),
        "num_attention_heads": _int(cfg, "num_attention_heads", 0),
        "q_lora_rank": _int(cfg, "q_lora_rank", 0) if cfg.get("q_lora_rank") is not None else 0,
        "n_routed_experts": _int(cfg, "n_routed_experts", 0),
        "n_shared_experts": _int(cfg, "n_shared_experts", 0),
        "moe_intermediate_size": _int(cfg, "moe_intermediate_size", 0),
    }


def _dsv4(cfg: Mapping[str, Any], arch: str) -> ModelSpec:
    common = _common(cfg)
    ratios = cfg.get("compress_ratios")
    if not isinstance(ratios, list) or not all(isinstance(r, int) for r in ratios):
        raise ConfigError("model config: DeepSeek-V4 needs 'compress_ratios', a list of integers")
    num_layers = common["num_layers"]
    if len(ratios) < num_layers:
        raise ConfigError(
            f"model config: 'compress_ratios' has {len(ratios)} entries, "
            f"expected at least num_hidden_layers={num_layers}"
        )
    # The target model's layers only: a trailing entry belongs to the MTP (NextN) layer.
    stage = tuple(ratios[:num_layers])
    unsupported = sorted(set(stage) - SUPPORTED_COMPRESS_RATIOS)
    if unsupported:
        raise ConfigError(
            f"model config: compress ratio(s) {unsupported} are not sized by this configurator "
            f"(supported: {sorted(SUPPORTED_COMPRESS_RATIOS)})"
        )
    head_dim = _int(cfg, "head_dim")
    if head_dim <= common["qk_rope_head_dim"]:
        raise ConfigError("model config: 'head_dim' must exceed 'qk_rope_head_dim'")
    return ModelSpec(
        kind=ModelKind.DSV4,
        architecture=arch,
        qk_nope_head_dim=head_dim - common["qk_rope_head_dim"],
        sliding_window=_int(cfg, "sliding_window"),
        compress_ratios=stage,
        o_lora_rank=_int(cfg, "o_lora_rank", 0),
        **common,
    )


def _dsa_indexer_layers(cfg: Mapping[str, Any], num_layers: int) -> int:
    """Layers computing a fresh top-k (and so owning index-K storage); the others reuse
    the previous layer's top-k under SGLang's shared-top-k elision."""
    freq = cfg.get("index_topk_freq") or 1
    offset = cfg.get("index_skip_topk_offset")
    if not isinstance(freq, int) or freq <= 0:
        raise ConfigError(
            f"model config: 'index_topk_freq' must be a positive integer, got {freq!r}"
        )
    if offset is not None and (not isinstance(offset, int) or offset <= 0):
        raise ConfigError(
            f"model config: 'index_skip_topk_offset' must be positive, got {offset!r}"
        )

    def skips(layer: int) -> bool:
        if offset is not None:
            return max(layer - offset + 1, 0) % freq != 0
        return max(layer - 1, 0) % freq != 0

    return sum(not skips(layer) for layer in range(num_layers))


def _dsa(cfg: Mapping[str, Any], arch: str) -> ModelSpec:
    common = _common(cfg)
    for key in ("indexer_types", "index_topk_pattern", "cli_factor"):
        if cfg.get(key) not in (None, 1):
            raise ConfigError(f"model config: DSA field {key!r} is not sized by this configurator")
    kpool = cfg.get("index_kpool", 1)
    if not isinstance(kpool, int) or kpool <= 0:
        raise ConfigError(f"model config: 'index_kpool' must be a positive integer, got {kpool!r}")
    return ModelSpec(
        kind=ModelKind.DSA,
        architecture=arch,
        kv_lora_rank=_int(cfg, "kv_lora_rank"),
        index_kpool=kpool,
        indexer_layers=_dsa_indexer_layers(cfg, common["num_layers"]),
        intermediate_size=_int(cfg, "intermediate_size", 0),
        first_k_dense_replace=_int(cfg, "first_k_dense_replace", 0),
        qk_nope_head_dim=_int(cfg, "qk_nope_head_dim", 0),
        **common,
    )


def model_spec_from_hf_config(cfg: Mapping[str, Any]) -> ModelSpec:
    """Parse a Hugging Face config dict; unknown models fail with the architecture named."""
    arch = _architecture(cfg)
    if arch in DSV4_ARCHITECTURES:
        return _dsv4(cfg, arch)
    if arch in DSA_ARCHITECTURES and cfg.get("index_topk") is not None:
        return _dsa(cfg, arch)
    known = sorted(DSV4_ARCHITECTURES | DSA_ARCHITECTURES)
    raise ConfigError(
        f"model config: unknown model architecture {arch!r} "
        f"(model_type {cfg.get('model_type')!r}); expected a DeepSeek-V4 or a DSA "
        f"(index_topk set) DeepSeek-V3.x model: one of {', '.join(known)}"
    )
