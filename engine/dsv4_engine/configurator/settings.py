"""Engine settings that change pool sizes, with SGLang 0.5.23's names and defaults.

Validated on construction so every later step can trust them; a bad value fails with the
field named.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dsv4_engine.configurator.errors import ConfigError
from dsv4_engine.engine_config import Backend
from dsv4_engine.features import IndexDtype
from dsv4_engine.index_k import sglang_index_dtype_error

DisaggregationMode = Literal["null", "prefill", "decode"]
# How the plan prices an fp4 index-K: "fp8" is what SGLang 0.5.23 budgets on NVIDIA
# (its pool then allocates the smaller fp4 rows), "exact" is the fp4 row size itself
# (what it budgets on HIP).
Fp4Budget = Literal["fp8", "exact"]


@dataclass(frozen=True)
class EngineSettings:
    """Per-server settings; sizes are per rank (one attention-DP worker)."""

    index_dtype: IndexDtype = IndexDtype.FP8
    # The engine whose index-K storage the plan describes: SGLang stores fp8 or fp4 only;
    # the reference engine also stores bf16 (sized as SGLang would size 256-byte rows).
    engine: Backend = Backend.SGLANG
    # Reproduce the seed's bf16 sizing bug (its fork of SGLang stored bf16 index-K and
    # priced it with the fp8 formula x the bf16 element size).
    legacy: bool = False
    # DeepSeek-V4 runs with page 256 on CUDA (SGLang's model override).
    page_size: int = 256
    tp_size: int = 1
    # Attention data-parallel size (--dp with --enable-dp-attention): max running
    # requests are divided over this many workers.
    dp_size: int = 1
    # --swa-full-tokens-ratio; None = not given: SGLang's V4 override then sets 0.1, except
    # for deepseek_v41 configs, whose SWA pool it sizes from the request cap instead.
    swa_full_tokens_ratio: float | None = None
    # None: SGLang's default for the model (256 for DeepSeek-V4).
    max_running_requests: int | None = None
    chunked_prefill_size: int = 8192
    # Speculative decoding (MTP/EAGLE, top-k 1); 0 draft tokens = off.
    speculative_num_draft_tokens: int = 0
    speculative_num_steps: int = 0
    disable_overlap_schedule: bool = False
    disaggregation_mode: DisaggregationMode = "null"
    disaggregation_decode_extra_slots: int = 0
    # None = SGLang's default: off on a PD decode server, on elsewhere.
    disable_radix_cache: bool | None = None
    swa_prefix_tails: int | None = None
    # DSA models only: the MLA latent's dtype (DeepSeek-V4's FlashMLA layout is fixed).
    kv_cache_dtype: Literal["fp8_e4m3", "bfloat16"] = "fp8_e4m3"
    fp4_budget: Fp4Budget = "fp8"
    # SGLANG_DSV4_COMPRESS_STATE_DTYPE.
    compress_state_dtype: Literal["float32", "bfloat16"] = "float32"

    def __post_init__(self) -> None:
        if not isinstance(self.index_dtype, IndexDtype):
            try:
                object.__setattr__(self, "index_dtype", IndexDtype(self.index_dtype))
            except ValueError:
                raise ConfigError(
                    f"index_dtype: expected one of fp8, bf16, fp4, got {self.index_dtype!r}"
                ) from None
        try:
            object.__setattr__(self, "engine", Backend(self.engine))
        except ValueError:
            raise ConfigError(
                f"engine: expected one of {', '.join(Backend)}, got {self.engine!r}"
            ) from None
        refusal = sglang_index_dtype_error(self.index_dtype)
        if self.engine is Backend.SGLANG and not self.legacy and refusal is not None:
            raise ConfigError(refusal)
        _positive("page_size", self.page_size)
        _positive("tp_size", self.tp_size)
        _positive("dp_size", self.dp_size)
        _positive("chunked_prefill_size", self.chunked_prefill_size, allow_zero=True)
        if self.tp_size % self.dp_size:
            raise ConfigError(
                f"dp_size: attention DP size {self.dp_size} must divide tp_size {self.tp_size}"
            )
        ratio = self.swa_full_tokens_ratio
        if ratio is not None and not 0 < ratio <= 1:
            raise ConfigError(f"swa_full_tokens_ratio: expected a value in (0, 1], got {ratio}")
        if self.max_running_requests is not None:
            _positive("max_running_requests", self.max_running_requests)
        _positive(
            "speculative_num_draft_tokens", self.speculative_num_draft_tokens, allow_zero=True
        )
        _positive("speculative_num_steps", self.speculative_num_steps, allow_zero=True)
        _positive(
            "disaggregation_decode_extra_slots",
            self.disaggregation_decode_extra_slots,
            allow_zero=True,
        )
        if self.swa_prefix_tails is not None:
            _positive("swa_prefix_tails", self.swa_prefix_tails, allow_zero=True)
        if self.disaggregation_mode not in ("null", "prefill", "decode"):
            raise ConfigError(
                f"disaggregation_mode: expected null, prefill or decode, got {self.disaggregation_mode!r}"
            )

    @property
    def speculative(self) -> bool:
        return self.speculative_num_draft_tokens > 0

    @property
    def radix_cache_disabled(self) -> bool:
        if self.disable_radix_cache is None:
            return self.disaggregation_mode == "decode"
        return self.disable_radix_cache

    @property
    def max_running_requests_per_worker(self) -> int | None:
        if self.max_running_requests is None:
            return None
        return max(1, self.max_running_requests // self.dp_size)


def _positive(field: str, value: object, *, allow_zero: bool = False) -> None:
    low = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        expected = "a non-negative integer" if allow_zero else "a positive integer"
        raise ConfigError(f"{field}: expected {expected}, got {value!r}")
