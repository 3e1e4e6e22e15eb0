"""`dsv4-engine serve` settings: SGLang's flag names where SGLang has the flag, and SGLang's
defaults with them.

A flag SGLang 0.5.23 leaves unset until start-up (`None` in its ServerArgs: the page size,
the token pool, the request cap, the context length, the seed) is left to the engine here
too: the defaults below are then the reference model's own choices, as SGLang's would be
the real model's and GPU's.  A flag SGLang resolves to a fixed value when unset takes that
value: `--hicache-ratio` 2.0 (`arg_groups/hicache_hook.handle_hicache_ratio_default`), the
served model name the model path (`serving_hook.handle_missing_default_values`).
tests/unit/reference/test_serve_defaults_sglang.py compares every shared flag with SGLang's own
parser and hooks.

Validated once, before anything starts, so a bad flag ends the process with one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from dsv4_engine.engine_config import ReferenceModelKind
from dsv4_engine.features import HiCacheFeature, HiCacheMemLayout, HiCacheWritePolicy, IndexDtype

ECHO_CONTEXT = 16384  # dsv4_engine.reference.echo.model.MAX_CONTEXT (no torch here)


class DisaggregationMode(StrEnum):
    NULL = "null"
    PREFILL = "prefill"
    DECODE = "decode"

    @property
    def engine_type(self) -> str:
        """The `engine_type` label SGLang puts on its request metrics for this mode
        (`DisaggregationMode.to_engine_type`, srt/disaggregation/utils.py)."""
        return "unified" if self is DisaggregationMode.NULL else self.value


class SettingsError(ValueError):
    """A flag value the engine cannot run with; the message names the flag."""


# What SGLang resolves an unset --hicache-ratio to (a host tier twice the device pool).
DEFAULT_HICACHE_RATIO = 2.0


@dataclass(frozen=True)
class ServeSettings:
    host: str = "127.0.0.1"
    port: int = 30000
    model_path: str | None = None
    served_model_name: str = "dsv4-reference"  # unset: the model path, else this
    reference_model: ReferenceModelKind = ReferenceModelKind.RANDOM
    tp: int = 1
    page_size: int = 128
    index_dtype: IndexDtype = IndexDtype.FP8
    enable_hierarchical_cache: bool = False
    hicache_ratio: float = DEFAULT_HICACHE_RATIO
    hicache_size: int = 0  # GiB; 0: sized by the ratio (SGLang's meaning)
    hicache_write_policy: HiCacheWritePolicy = HiCacheWritePolicy.WRITE_THROUGH
    hicache_mem_layout: HiCacheMemLayout = HiCacheMemLayout.PAGE_FIRST
    # The simulated host→device copy (`hicache.transfer`): a latency per layer, then bytes at
    # a bandwidth (0: unthrottled, memcpy speed).
    hicache_bandwidth_mb_s: float = 64.0
    hicache_layer_latency_ms: float = 0.0
    max_running_requests: int = 64
    max_total_tokens: int = 131072
    context_length: int = 16384
    random_seed: int = 0  # seeds the reference weights
    disaggregation_mode: DisaggregationMode = DisaggregationMode.NULL
    disaggregation_bootstrap_port: int = 8998
    # SGLang's --kv-canary: none | log | raise.  On (log or raise), /metrics counts the
    # reads the pool's own check caught reading a load not landed yet (`metrics.STALE_READ`);
    # raise counts them too but does not stop the engine as SGLang does.
    kv_canary: str = "none"
    # Benign nondeterminism, as healthy SGLang shows it: a prefix-cache hit changes the
    # reduction order and flips a near-tie (sglang#34683: 18 of 40 greedy outputs).  This
    # share of the requests that hit the cache take the runner-up for their first token;
    # nothing is corrupted, but a warm answer is no longer the cold one (0: deterministic).
    benign_nondeterminism: float = 0.0

    def __post_init__(self) -> None:
        if self.tp != 1:
            raise SettingsError(f"--tp {self.tp}: the CPU reference engine runs only --tp 1")
        if self.page_size <= 0 or self.page_size % 128:
            raise SettingsError(
                f"--page-size {self.page_size}: expected a positive multiple of 128 "
                "(a c128 layer compresses 128 tokens into one entry per page)"
            )
        if self.hicache_size < 0:
            raise SettingsError(f"--hicache-size {self.hicache_size}: expected GiB >= 0")
        if self.enable_hierarchical_cache and not self.hicache_size and self.hicache_ratio <= 1:
            raise SettingsError(
                f"--hicache-ratio {self.hicache_ratio}: expected a number > 1 "
                "(the host tier must be larger than the device pool) or --hicache-size"
            )
        if self.hicache_bandwidth_mb_s < 0:
            raise SettingsError(f"--hicache-bandwidth {self.hicache_bandwidth_mb_s}: expected >= 0")
        if self.hicache_layer_latency_ms < 0:
            raise SettingsError(
                f"--hicache-layer-latency {self.hicache_layer_latency_ms}: expected ms >= 0"
            )
        for name in ("max_running_requests", "max_total_tokens", "context_length"):
            if getattr(self, name) <= 0:
                flag = "--" + name.replace("_", "-")
                raise SettingsError(f"{flag} {getattr(self, name)}: expected a positive integer")
        if self.max_total_tokens < self.page_size:
            raise SettingsError(
                f"--max-total-tokens {self.max_total_tokens}: expected at least one page "
                f"({self.page_size} tokens)"
            )
        if self.reference_model is ReferenceModelKind.ECHO and self.context_length > ECHO_CONTEXT:
            raise SettingsError(
                f"--context-length {self.context_length}: --reference-model echo reads at most "
                f"{ECHO_CONTEXT} tokens (its position code)"
            )
        if not 0 <= self.benign_nondeterminism < 1:
            raise SettingsError(
                f"--benign-nondeterminism {self.benign_nondeterminism}: expected a share in [0, 1)"
            )
        if self.benign_nondeterminism and self.reference_model is ReferenceModelKind.ECHO:
            raise SettingsError(
                "--benign-nondeterminism: the echo model copies its tokens with margins no "
                "reduction order flips (as a real model echoing IDs does); use the random model"
            )
        for name in ("port", "disaggregation_bootstrap_port"):
            if not 0 <= getattr(self, name) <= 65535:
                flag = "--" + name.replace("_", "-")
                raise SettingsError(f"{flag} {getattr(self, name)}: expected 0..65535")

    @property
    def hicache_feature(self) -> HiCacheFeature | None:
        if not self.enable_hierarchical_cache:
            return None
        return HiCacheFeature(
            enabled=True,
            ratio=None if self.hicache_size else self.hicache_ratio,
            size_gb=self.hicache_size or None,
            write_policy=self.hicache_write_policy,
            mem_layout=self.hicache_mem_layout,
        )

    @property
    def device_pages(self) -> int:
        return self.max_total_tokens // self.page_size
