"""What a probe run is asked to do: one typed model, shared by the CLI, the canary and the
report (which records it verbatim, so a report says exactly what was measured)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dsv4_engine.engine_config import Backend, ReferenceModelKind
from dsv4_engine.probe.dsml import DsmlFormat
from dsv4_engine.probe.stats import MAX_REQUESTS, minimum_samples


class ProbeName(StrEnum):
    """Workload shape × check."""

    TOOLCALL_ECHO = "toolcall-echo"
    """Single request: call a tool echoing random IDs and values exactly."""
    TOOLCALL_ECHO_PREFIX_REUSE = "toolcall-echo-prefix-reuse"
    """Multi-turn sessions over a long shared prefix, echoing at every turn."""
    TOOLCALL_ECHO_LONG_CONTEXT = "toolcall-echo-long-context"
    """Echo after a prompt long enough that the indexer's top-k really selects."""
    CACHE_CONSISTENCY = "cache-consistency"
    """Single request: greedy answer cold, then again after its prefix went to the host tier."""
    CACHE_CONSISTENCY_PREFIX_REUSE = "prefix-reuse"
    """Consistency with many sessions sharing each long prefix (cache hits under load)."""
    CACHE_CONSISTENCY_LONG_CONTEXT = "long-context"
    """Consistency on prompts longer than index_topk × compression ratio."""

    @property
    def needs_determinism(self) -> bool:
        return self in CONSISTENCY_PROBES


CONSISTENCY_PROBES = frozenset(
    {
        ProbeName.CACHE_CONSISTENCY,
        ProbeName.CACHE_CONSISTENCY_PREFIX_REUSE,
        ProbeName.CACHE_CONSISTENCY_LONG_CONTEXT,
    }
)

# A real model (sglang) follows instructions, so tool-call echo carries the verdict; the
# reference engine's random model answers noise, so only its consistency checks mean
# anything.  Its echo model follows the echo prompt: it gets the probe set a real model gets.
DEFAULT_PROBES: dict[Backend, tuple[ProbeName, ...]] = {
    Backend.SGLANG: (
        ProbeName.TOOLCALL_ECHO,
        ProbeName.TOOLCALL_ECHO_PREFIX_REUSE,
        ProbeName.TOOLCALL_ECHO_LONG_CONTEXT,
        ProbeName.CACHE_CONSISTENCY_PREFIX_REUSE,
    ),
    Backend.REFERENCE: (
        ProbeName.CACHE_CONSISTENCY,
        ProbeName.CACHE_CONSISTENCY_PREFIX_REUSE,
        ProbeName.CACHE_CONSISTENCY_LONG_CONTEXT,
    ),
}

ECHO_MODEL_PROBES = DEFAULT_PROBES[Backend.SGLANG]

# The reference engine's "push every cached prefix to the host tier" call: a test knob of
# the reference engine only (SGLang 0.5.23 has no such call; its /flush_cache drops the
# whole radix cache, host pool included).  Off by default: a canary reads prefixes back
# from the host tier by eviction, on either engine (`evidence`, `CanarySpec.device_pool_tokens`).
REFERENCE_OFFLOAD_PATH = "/admin/hicache/offload"


@dataclass(frozen=True)
class Workload:
    """How big a backend's probe prompts are, and how long its answers may run."""

    prefix_words: int
    long_context_words: int
    single_prompt_words: int
    """The single-request consistency probe's unique prompt."""
    consistency_max_tokens: int
    echo_max_tokens: int


# SGLang serves DeepSeek-V4-Flash: a filler word is ~1 token for its tokenizer, so the long
# context (4096 words) exceeds V4-Flash's index_topk × compress ratio = 512 × 4 = 2048
# tokens and its indexer truly selects, and a single request's 256 words fill four of its
# 64-token pages.  The reference engine's model selects top 16 of entries compressed 4:1
# (64 tokens) and tokenizes bytes (~6.5 tokens per word): 100 words are ~670 tokens, ten
# times its selection, and a 64-word prefix or single prompt is ~450 tokens, three full
# pages that a warm request loads back from the host tier while its indexer reads.  Under
# the seed's race these lengths lose nothing: raced, 62 of 73 long-context samples diverged
# at 100 words (65 at 200) and 57 of 73 single ones at 64 words (68 at 256), and a PASS
# prefills half the chunks.  Its warm-vs-cold answers diverge within a few tokens when a
# read races a load, so 8 tokens judge it: a canary at the production defaults (598
# samples) then runs in under a minute on two CPU cores.  An echo call of the probes' tool
# is about 100 tokens for DeepSeek's tokenizer and 110 for the reference engine's (bytes,
# its markup in pieces); each budget leaves room for a value or two longer than the probes'.
DEFAULT_WORKLOAD: dict[Backend, Workload] = {
    Backend.SGLANG: Workload(
        prefix_words=1024,
        long_context_words=4096,
        single_prompt_words=256,
        consistency_max_tokens=32,
        echo_max_tokens=256,
    ),
    Backend.REFERENCE: Workload(
        prefix_words=64,
        long_context_words=100,
        single_prompt_words=64,
        consistency_max_tokens=8,
        echo_max_tokens=256,
    ),
}


class Determinism(StrEnum):
    AUTO = "auto"
    """Ask GET /server_info (SGLang `enable_deterministic_inference`, reference `deterministic`)."""
    YES = "yes"
    NO = "no"


class ProbeSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    base_url: str = Field(
        pattern=r"^https?://", description="Engine or router, e.g. http://host:30000"
    )
    backend: Backend = Backend.SGLANG
    baseline_url: str | None = Field(default=None, pattern=r"^https?://")
    """The stable side (its router), for an engine that is not deterministic: the
    consistency probes then run on both with the same prompts, and the canary's warm-vs-cold
    divergence is judged against the stable's own (`stats.excess_bounds`).  None: they do
    not apply to such an engine."""
    max_divergence_excess: float = Field(default=0.05, gt=0, lt=1)
    """How far the canary's divergence rate may exceed the stable's.  Looser than
    `max_corruption_rate` because a stable's own noise (healthy SGLang flips 18 of 40
    greedy outputs on a prefix hit, sglang#34683) leaves hundreds of samples unable to
    resolve half a percent; the tool-call echo probes, judged alone, keep that budget."""
    model: str | None = Field(default=None, description="None: the first of GET /v1/models")
    probes: tuple[ProbeName, ...] = ()
    """Empty: the backend's default set."""
    format: DsmlFormat = DsmlFormat.V4
    concurrency: int = Field(default=64, ge=1, le=4096)
    requests: int | None = Field(default=None, ge=1, le=MAX_REQUESTS)
    """Samples to judge; None: the fewest that can PASS (`stats.minimum_samples`, 598 at
    0.5% and 95%), the same number the canary uses by default."""
    max_corruption_rate: float = Field(default=0.005, gt=0, lt=1)
    confidence: float = Field(default=0.95, gt=0.5, lt=1)
    warm_up_s: float = Field(default=60.0, gt=0)
    """How long the first (warm-up) request may keep failing before the engine counts as
    not answering (no verdict); after its answer every failed request is a failure."""
    max_duration_s: float | None = Field(default=None, gt=0)
    """Stop starting samples after this long (a canary step has a deadline); None: no limit."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Tokens of each tool-call answer; None: the backend's default (DEFAULT_WORKLOAD)."""
    consistency_max_tokens: int | None = Field(default=None, ge=1)
    """Tokens of each consistency answer; None: the backend's default (DEFAULT_WORKLOAD)."""
    request_timeout_s: float = Field(default=120.0, gt=0)
    connect_timeout_s: float = Field(default=10.0, gt=0)
    seed: int = 0
    deterministic: Determinism = Determinism.AUTO
    reference_model: ReferenceModelKind | None = None
    """The model a reference engine serves, when the default probe set depends on it; None:
    ask GET /server_info (an engine answers it; sglang-router does not)."""
    admin_offload_path: str | None = None
    """A reference-only test knob: the POST path that pushes cached prefixes to the host
    tier before each judged request ("default": the reference engine's); None: off, the
    host tier is reached by eviction."""
    hicache: bool = False
    """The engine under test runs HiCache: a PASS then needs enough samples that read a
    prefix back from its host tier (`verdict.unexercised`)."""
    kv_canary: bool = False
    """The engines run SGLang's kv-canary: their violations are read through the router
    before and after the run (`dsv4_engine.kv_canary`), and any new one FAILs it."""
    stream_share: float = Field(default=0.25, ge=0, le=1)
    """The share of tool-call echo samples whose judged request streams (users call both
    ways, and a streamed tool call is assembled from deltas by another code path of the
    engine: SGLang's `_process_tool_call_stream`); each sample draws from its own seed."""
    prefix_words: int | None = Field(default=None, ge=16)
    """Shared-prefix length; None: the backend's default (DEFAULT_WORKLOAD)."""
    long_context_words: int | None = Field(default=None, ge=64)
    """Long-context prompt length; None: the backend's default (DEFAULT_WORKLOAD)."""
    sessions_per_prefix: int = Field(default=8, ge=1)
    api_key: str | None = None

    @model_validator(mode="after")
    def _valid_paths(self) -> ProbeSettings:
        path = self.admin_offload_path
        if path not in (None, "default") and not path.startswith("/"):
            raise ValueError(f"admin_offload_path must start with '/', got {path!r}")
        return self

    def probe_set(self, reference_model: ReferenceModelKind | None = None) -> tuple[ProbeName, ...]:
        """The probes asked for, else the engine's default: on the reference engine, the
        default of the model it serves (GET /server_info says which; see the runner)."""
        if self.probes:
            return self.probes
        if self.backend is Backend.REFERENCE and reference_model is ReferenceModelKind.ECHO:
            return ECHO_MODEL_PROBES
        return DEFAULT_PROBES[self.backend]

    @property
    def offload_path(self) -> str | None:
        if self.admin_offload_path == "default":
            return REFERENCE_OFFLOAD_PATH
        return self.admin_offload_path

    @property
    def shared_prefix_words(self) -> int:
        return self.prefix_words or DEFAULT_WORKLOAD[self.backend].prefix_words

    @property
    def long_prompt_words(self) -> int:
        return self.long_context_words or DEFAULT_WORKLOAD[self.backend].long_context_words

    @property
    def single_prompt_words(self) -> int:
        return DEFAULT_WORKLOAD[self.backend].single_prompt_words

    @property
    def echo_tokens(self) -> int:
        return self.max_tokens or DEFAULT_WORKLOAD[self.backend].echo_max_tokens

    @property
    def consistency_tokens(self) -> int:
        default = DEFAULT_WORKLOAD[self.backend].consistency_max_tokens
        return self.consistency_max_tokens or default

    @property
    def sample_budget(self) -> int:
        if self.requests is not None:
            return self.requests
        return minimum_samples(self.max_corruption_rate, self.confidence)
