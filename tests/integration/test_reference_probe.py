"""The corruption probe against the reference engine, end to end: gated HiCache + bf16
index-K, its device pool small enough that the probe's prefixes are evicted to the host tier
and read back -> PASS, with the samples the engine's own host-tier count proves; the
index-K gate removed -> FAIL (here with the reference engine's offload knob, which pushes
every prefix to the host tier before its warm request: the race shows at once)."""

from __future__ import annotations

import asyncio

import pytest

from dsv4_engine.probe import ProbeName, ProbeResult, ProbeSettings, run_probes
from dsv4_engine.probe.verdict import Verdict

pytestmark = pytest.mark.slow

HICACHE_BF16 = ("--enable-hierarchical-cache", "--hicache-ratio", "2", "--index-dtype", "bf16")
FLAGS = (*HICACHE_BF16, "--hicache-bandwidth", "1")


def probe(url: str, max_rate: float, requests: int = 48, knob: bool = True) -> ProbeResult:
    settings = ProbeSettings(
        base_url=url,
        backend="reference",
        probes=(ProbeName.CACHE_CONSISTENCY_PREFIX_REUSE,),
        concurrency=32,
        requests=requests,
        max_corruption_rate=max_rate,
        consistency_max_tokens=8,
        prefix_words=96,
        sessions_per_prefix=6,
        request_timeout_s=120,
        hicache=True,
        admin_offload_path="default" if knob else None,
    )
    return asyncio.run(run_probes(settings))


def test_gated_engine_passes_reading_its_prefixes_back_by_eviction(start_server):
    """No knob: the probe sizes its prefixes from the pool the engine reports (an 8,192-token
    device pool, twice that on host) so that they outgrow the device pool and fit the host
    tier; a group's prefix comes back from the host tier on its next turn, and the engine's
    own count of host-tier tokens proves enough samples read it."""
    result = probe(start_server(*FLAGS, "--max-total-tokens", "8192"), 0.1, 96, knob=False)
    assert result.verdict is Verdict.PASS, result.reasons
    assert result.host_tier is not None and result.host_tier.host_tokens > 0
    assert result.host_tier.pool is not None and result.host_tier.pool.device == 8192
    assert result.host_tier.prefix_groups > 32 // 6  # sized past the default groups
    assert result.judged == 96 and 24 <= result.tally.exercised <= 2 * 96  # answers: cold, warm


def test_ungated_index_k_fails(start_server):
    url = start_server(*FLAGS, env={"DSV4_INJECT_UNGATED_INDEX_K": "1"})
    assert probe(url, max_rate=0.02).verdict is Verdict.FAIL


def test_the_reference_workloads_prompts_show_the_race_on_every_consistency_probe(start_server):
    """The reference backend's default prompt lengths (`DEFAULT_WORKLOAD`: a 64-word single
    prompt, a 100-word long context, a 64-word shared prefix) are short enough to be cheap
    and long enough that the race shows: raced, on the engine's default host link, a good
    share of each probe's samples diverge, far above the one in two hundred a FAIL needs.

    Measured on 6 fresh servers (24 samples each): single prompts 19, long contexts 22-23,
    shared prefixes 13-18 (and 11 once, in a busy suite).  A shared prefix's sessions
    diverge only when they ride the step that loads the prefix back, which arrival timing
    decides, so that probe's floor is a quarter, not a half."""
    url = start_server(*HICACHE_BF16, env={"DSV4_INJECT_UNGATED_INDEX_K": "1"})
    floors = {
        ProbeName.CACHE_CONSISTENCY: 12,
        ProbeName.CACHE_CONSISTENCY_LONG_CONTEXT: 12,
        ProbeName.CACHE_CONSISTENCY_PREFIX_REUSE: 6,
    }
    for name, floor in floors.items():
        settings = ProbeSettings(
            base_url=url, backend="reference", probes=(name,), concurrency=24, requests=24,
            hicache=True, admin_offload_path="default",
        )  # fmt: skip
        result = asyncio.run(run_probes(settings))
        assert result.judged == 24 and result.corrupt >= floor, (name, result.corrupt)
