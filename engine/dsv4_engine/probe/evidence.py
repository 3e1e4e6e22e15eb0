"""What the engines themselves counted during a probe run, read through the router users run.

Two facts a verdict rests on come from the engines, not from the answers they give:

- **kv-canary violations** (`dsv4_engine.kv_canary`): any one FAILs the run; a page that
  cannot vouch for them (`kv_canary.unread`) leaves the run unable to PASS.
- **Host-tier reads.**  sglang-router 0.3.2 re-serialises every request it forwards and
  drops ``return_cached_tokens_details``, so no answer through it says what its prompt read
  back from the host tier.  SGLang counts it itself, per finished request:
  ``sglang:cached_tokens_total{cache_source="host"}``
  (`TokenizerMetricsCollector.observe_one_finished_request`,
  srt/observability/metrics_collector.py:2100-2134, called from
  `TokenizerManager.collect_metrics`, srt/managers/tokenizer_manager.py:3260-3300), on the
  server that ran the prefix match (``engine_type="prefill"``, or ``"unified"`` without
  PD); a PD decode server counts the same tokens again from the transfer's metadata, so
  only the prefill side is read.  The reference engine counts the same way.

From host-tier tokens to judged answers: while a probe runs, only its samples' requests
reach the canary, and a request can read at most its prompt from the host tier.  Requests
whose answers are not judged (a failed one, the reference-only knob's priming request) may
have read as much as their prompts hold; the rest of the H tokens the engines read back
were read by judged requests, and the fewest of those whose prompts can hold it (the
largest first) is a lower bound on how many judged answers read from the host tier
(`proven_exercised`): a PASS needs it to reach `verdict.exercised_needed`.  A prompt whose
size no answer reported is taken at the most it can be (`prompt_token_bound`), so the
bound never overstates.

The same pages give the prefill engine's pool sizes, from which the probe sizes its
working set so that its prefixes leave the device pool between two turns and are still on
the host tier when read again (`PoolSizes.working_set`, `runner._prefix_groups`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from dsv4_engine import engine_metrics, kv_canary

CACHED_TOKENS = "sglang:cached_tokens_total"
DEVICE_POOL = "sglang:max_total_num_tokens"
HOST_POOL = "sglang:hicache_host_total_tokens"
# The engine types whose prefix cache a request's prompt is matched against.
MATCHING = ("prefill", "unified")
# A prompt no answer gave the size of: at most one token per byte of its messages and tools
# (a byte-level BPE never has fewer bytes than tokens) plus the chat template's own text.
TEMPLATE_TOKENS = 4096


@dataclass(frozen=True)
class PoolSizes:
    """The prefill engine's device KV pool and host tier, in tokens."""

    device: int
    host: int

    @property
    def working_set(self) -> int:
        """Prompt tokens the samples should send between two turns of one shared prefix:
        halfway between the device pool and the host tier (larger: SGLang requires a ratio
        above 1).  More than the device pool holds, so the prefix has left it; less than the
        host tier holds, so it is still there to be read back."""
        return (self.device + self.host) // 2


@dataclass(frozen=True)
class EngineReading:
    """One read of the engines' pages (a router's ``GET /engine_metrics``)."""

    kv_counts: kv_canary.Counts = field(default_factory=dict)
    kv_unread: str | None = None
    """Why the page cannot vouch for kv-canary violations (`kv_canary.unread`), or None."""
    host_tokens: dict[str, int] = field(default_factory=dict)
    """Host-tier prompt tokens counted by each prefix-matching engine, by worker."""
    pool: PoolSizes | None = None


def read(text: str) -> EngineReading:
    page = engine_metrics.samples(text)
    host: dict[str, int] = {}
    for sample in engine_metrics.named(page, CACHED_TOKENS):
        if sample.labels.get("cache_source") == "host" and _matching(sample):
            host[sample.worker] = host.get(sample.worker, 0) + int(sample.value)
    return EngineReading(
        kv_counts=kv_canary.read(text),
        kv_unread=kv_canary.unread(text),
        host_tokens=host,
        pool=_pool(page),
    )


def _matching(sample: engine_metrics.Sample) -> bool:
    return sample.labels.get(kv_canary.ENGINE_TYPE, "unified") in MATCHING


def _pool(page: list[engine_metrics.Sample]) -> PoolSizes | None:
    """The smallest prefix-matching engine's pool: the one whose tier a prefix leaves first."""
    devices = {
        s.worker: int(s.value) for s in engine_metrics.named(page, DEVICE_POOL) if _matching(s)
    }
    hosts = {s.worker: int(s.value) for s in engine_metrics.named(page, HOST_POOL) if _matching(s)}
    both = [(devices[w], hosts[w]) for w in devices.keys() & hosts.keys() if devices[w] > 0]
    if not both:
        return None
    return PoolSizes(*min(both))


def host_tokens_read(before: EngineReading, after: EngineReading) -> int:
    """Host-tier prompt tokens the engines counted between two reads (an engine that
    restarted counts from 0: all it counted since is new)."""
    total = 0
    for worker, count in after.host_tokens.items():
        grown = count - before.host_tokens.get(worker, 0)
        total += grown if grown >= 0 else count
    return total


def prompt_token_bound(body: dict[str, Any]) -> int:
    """The most tokens ``body``'s prompt can be (`TEMPLATE_TOKENS`)."""
    content = json.dumps([body.get("messages"), body.get("tools")], ensure_ascii=False)
    return len(content.encode()) + TEMPLATE_TOKENS


def proven_exercised(host_tokens: int, judged: Iterable[int], unjudged: int = 0) -> int:
    """How many judged answers at least read from the host tier: the fewest judged
    requests whose prompts (``judged``) can hold the ``host_tokens`` the unjudged requests'
    prompts (``unjudged`` tokens in all) cannot.  0 when the judged prompts cannot hold the
    rest either (other traffic read from the host tier: nothing is proven)."""
    left = host_tokens - unjudged
    if left <= 0:
        return 0
    held = 0
    for count, prompt in enumerate(sorted(judged, reverse=True), start=1):
        held += prompt
        if held >= left:
            return count
    return 0
