"""Engine counters and their Prometheus text: SGLang's metric names where the meaning is
the same (so dashboards and the operator's canary read both engines alike), `dsv4:` for
the index-K integrity counters SGLang does not have."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from dsv4_engine import kv_canary

# The reference engine's kv-canary check: each page carries the generation of the HiCache
# load that filled it, and a read that finds its load not landed yet read stale data (the
# pool counts it: `DevicePool.stale_reads`).  Its launch tags name the buffer read.
STALE_READ = "load_not_landed"


@dataclass
class EngineStats:
    """Written by the engine thread only; read (a snapshot is good enough) by HTTP."""

    running: int = 0
    queued: int = 0
    finished: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generation_tokens: int = 0
    load_back_tokens: int = 0
    offloaded_tokens: int = 0
    transfer_failures: int = 0
    transfer_format_mismatches: int = 0
    device_cached_tokens: int = 0
    host_cached_tokens: int = 0
    free_pages: int = 0

    def count_prompt(self, prompt: int, cached: int) -> None:
        self.prompt_tokens += prompt
        self.cached_tokens += cached

    def set_cache(self, device: int, host: int, free_pages: int) -> None:
        self.device_cached_tokens, self.host_cached_tokens = device, host
        self.free_pages = free_pages

    @property
    def cache_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass
class ServedCounts:
    """Prompt tokens of finished requests by where the prefix cache held them, counted as
    SGLang's tokenizer counts a finished request (`sglang:cached_tokens_total` by
    `cache_source`, `TokenizerMetricsCollector.observe_one_finished_request`): on a PD
    decode server from the counts the prefill server handed over with the pages.  Written
    by the HTTP server's event loop only."""

    device: int = 0
    host: int = 0

    def count(self, cached: int, host: int) -> None:
        self.device += cached - host
        self.host += host


# SGLang 0.5.23's buckets of `sglang:time_to_first_token_seconds`
# (observability/metrics_collector.py, `bucket_time_to_first_token`).
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
TTFT = "sglang:time_to_first_token_seconds"


@dataclass
class FirstTokenTimes:
    """Seconds from a request's arrival to its first generated token, as SGLang's histogram
    counts them (labelled ``is_streaming``): what `DSV4EngineSlowFirstToken` reads.
    Written by the HTTP server's event loop only."""

    buckets: dict[bool, list[int]] = field(default_factory=dict)
    sums: dict[bool, float] = field(default_factory=dict)

    def observe(self, seconds: float, streaming: bool) -> None:
        counts = self.buckets.setdefault(streaming, [0] * (len(TTFT_BUCKETS) + 1))
        counts[next((i for i, le in enumerate(TTFT_BUCKETS) if seconds <= le), -1)] += 1
        self.sums[streaming] = self.sums.get(streaming, 0.0) + seconds

    def lines(self, base: str) -> list[str]:
        out = [
            f"# HELP {TTFT} Histogram of time to first token in seconds.",
            f"# TYPE {TTFT} histogram",
        ]
        for streaming, counts in sorted(self.buckets.items()):
            labels = f'{base},is_streaming="{str(streaming).lower()}"'
            total = 0
            for le, n in zip((*TTFT_BUCKETS, "+Inf"), counts, strict=True):
                total += n
                bound = le if isinstance(le, str) else f"{float(le)}"
                out.append(f'{TTFT}_bucket{{{labels},le="{bound}"}} {total}')
            out += [
                f"{TTFT}_sum{{{labels}}} {self.sums[streaming]}",
                f"{TTFT}_count{{{labels}}} {total}",
            ]
        return out


@dataclass(frozen=True)
class Page:
    """What one /metrics page shows."""

    stats: EngineStats
    served: ServedCounts
    model: str
    engine_type: str
    """SGLang's label for the server's disaggregation mode: prefill, decode or unified."""
    page_size: int
    total_pages: int
    host_pages: int | None
    """The host tier's pages; None: no HiCache."""
    gate_waits: int
    gate_blocked: int
    gated: bool
    stale_index_k_reads: int
    kv_canary_violations: dict[str, int] | None = None
    """By launch tag; None: kv-canary off."""
    live: Sequence[str] = ()
    """The live judge's families (`dsv4_engine.live_judge.render`), labelled by revision,
    role and outcome as on SGLang's page; none on a PD prefill server."""
    first_token: FirstTokenTimes | None = None
    """None: nothing generated here (a PD prefill server answers with no token)."""


def render(page: Page) -> str:
    """The page, in prometheus_client's text format (each family's HELP and TYPE, a
    counter's samples named with its `_total`): sglang-router's `/engine_metrics` parses
    every worker's page and drops one it cannot parse.  Every sample carries SGLang's
    `model_name` and `engine_type` labels, but the live judge's, which carry the labels
    the SGLang plugin gives them (revision, role, outcome)."""
    stats = page.stats
    base = f'model_name="{page.model}",engine_type="{page.engine_type}"'
    used = 1 - stats.free_pages / page.total_pages if page.total_pages else 0.0
    rows = [
        ("sglang:num_running_reqs", "gauge", "Requests in the running batch.", stats.running),
        ("sglang:num_queue_reqs", "gauge", "Requests waiting to be admitted.", stats.queued),
        ("sglang:token_usage", "gauge", "Fraction of device KV pages in use.", used),
        ("sglang:max_total_num_tokens", "gauge", "Tokens the device KV pool holds.",
         page.total_pages * page.page_size),
        ("sglang:cache_hit_rate", "gauge", "Prompt tokens served from the prefix cache.",
         stats.cache_hit_rate),
        ("sglang:prompt_tokens_total", "counter", "Prompt tokens.", stats.prompt_tokens),
        ("sglang:generation_tokens_total", "counter", "Generated tokens.",
         stats.generation_tokens),
        ("sglang:num_requests_total", "counter", "Finished requests.", stats.finished),
        ("sglang:load_back_tokens_total", "counter", "Tokens loaded back from the host tier.",
         stats.load_back_tokens),
        ("sglang:hicache_host_used_tokens", "gauge", "Tokens held by the host tier.",
         stats.host_cached_tokens),
        ("dsv4:offloaded_tokens_total", "counter", "Tokens pushed to host by the admin call.",
         stats.offloaded_tokens),
        ("dsv4:index_k_gated", "gauge", "1 when index-K reads wait at the layer gate.",
         int(page.gated)),
        ("dsv4:layer_gate_waits_total", "counter", "Device reads that passed the layer gate.",
         page.gate_waits),
        ("dsv4:layer_gate_blocked_total", "counter", "Gate passes that waited for a load.",
         page.gate_blocked),
        ("dsv4:index_k_reads_during_load_total", "counter",
         "Index-K reads that found a page whose HiCache load had not landed (observed: each "
         "page carries its load's generation).", page.stale_index_k_reads),
        ("dsv4:hicache_transfer_failures_total", "counter",
         "HiCache loads that failed their checksum or timed out.", stats.transfer_failures),
        ("dsv4:pd_transfer_format_mismatch_total", "counter",
         "PD transfers refused: the prefill engine laid its pages out for another format "
         "(index-K dtype, KV dtype, page size or build) than this decode engine's.",
         stats.transfer_format_mismatches),
    ]  # fmt: skip
    if page.host_pages is not None:
        rows.append(("sglang:hicache_host_total_tokens", "gauge", "Tokens the host tier holds.",
                     page.host_pages * page.page_size))  # fmt: skip
    out = []
    for name, kind, doc, value in rows:
        out += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}", f"{name}{{{base}}} {value}"]
    name = "sglang:cached_tokens_total"
    out += [f"# HELP {name} Number of cached prompt tokens by source (device/host).",
            f"# TYPE {name} counter"]  # fmt: skip
    for source, count in (("device", page.served.device), ("host", page.served.host)):
        out.append(f'{name}{{{base},cache_source="{source}"}} {count}')
    if page.kv_canary_violations is not None:
        out += [
            f"# HELP {kv_canary.ARMED} {kv_canary.ARMED_HELP}",
            f"# TYPE {kv_canary.ARMED} gauge",
            f"{kv_canary.ARMED}{{{base}}} 1",
            f"# HELP {kv_canary.METRIC} {kv_canary.HELP}",
            f"# TYPE {kv_canary.METRIC} counter",
        ]
        out += [
            f'{kv_canary.METRIC}{{{base},launch_tag="{tag}",fail_reason="{STALE_READ}"}} {count}'
            for tag, count in page.kv_canary_violations.items()
        ]
    if page.first_token is not None:
        out += page.first_token.lines(base)
    out += page.live
    return "\n".join(out) + "\n"
