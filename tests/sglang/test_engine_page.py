"""The evidence the probe reads, made by SGLang 0.5.23's own classes and read through the
real sglang-router 0.3.2: a prefill and a decode engine process each finish one request
whose prompt loaded HOST tokens back from the host tier and run a kv-canary check with the
project's plugin (engine_page_harness.py); their /metrics pages, served behind the router,
come back on its GET /engine_metrics as the probe reads them (`dsv4_engine.probe.evidence`):
the host-tier tokens counted once (on the prefill side, though the decode counts them too),
and both engines vouching for their kv-canary counter."""

from __future__ import annotations

import importlib.util
import inspect
import os
from pathlib import Path

import pytest

from dsv4_engine import kv_canary
from dsv4_engine.probe.evidence import host_tokens_read, read
from tests.real_router import Worker, get, router, serving

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

HARNESS = Path(__file__).with_name("engine_page_harness.py")
DEVICE, HOST = 256, 384


@pytest.fixture(scope="module")
def pages(fresh_process, model_dirs):
    """Each engine's /metrics page, by disaggregation mode (SGLang with the plugin)."""
    out = {}
    for mode in ("prefill", "decode"):
        env = {**os.environ, "SGLANG_PLUGINS": "dsv4_index_k"}
        run = fresh_process(HARNESS, model_dirs["flash"], mode, str(DEVICE), str(HOST), env=env)
        assert run.returncode == 0, run.stderr[-2000:]
        out[mode] = run.stdout
    return out


def test_sglangs_own_counter_holds_the_host_tier_tokens_on_each_engine(pages):
    for mode, page in pages.items():
        assert (
            f'sglang:cached_tokens_total{{cache_source="host",engine_type="{mode}",'
            f'model_name="deepseek-v4-flash"}} {float(HOST)}'
        ) in page
        assert f'dsv4:kv_canary_armed{{engine_type="{mode}"}} 1.0' in page


def test_through_the_real_router_the_probe_counts_them_once_and_both_engines_vouch(pages, tmp_path):
    prefill, decode = (
        Worker("prefill", page=pages["prefill"]),
        Worker("decode", page=pages["decode"]),
    )
    with serving(prefill, decode) as (p_url, d_url):
        args = ["--pd-disaggregation", "--prefill", p_url, "8998", "--decode", d_url]
        with router(args, tmp_path / "router.log") as url:
            status, raw = get(f"{url}/engine_metrics")
    assert status == 200
    text = raw.decode()
    assert kv_canary.unread(text) is None
    assert kv_canary.read(text) == {}  # no violation: none counted, and the page vouches
    before = read("")  # nothing counted yet
    assert host_tokens_read(before, read(text)) == HOST
    assert read(text).pool is None  # a tokenizer process serves no pool gauges


def test_flush_cache_empties_the_host_tier_too_so_it_cannot_force_a_host_read():
    """Why a canary reaches SGLang's host tier by eviction, not by a call (the reference
    engine's offload is a test knob: `settings.REFERENCE_OFFLOAD_PATH`): `/flush_cache`
    resets the whole radix cache, host pool included, and only when no request runs —
    nothing is left on host for the next request to read back."""
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    reset = inspect.getsource(UnifiedRadixCache._reset_full)
    assert "self.cache_controller.mem_pool_host.clear()" in reset
    scheduler = importlib.util.find_spec("sglang.srt.managers.scheduler")
    assert scheduler is not None and scheduler.origin is not None
    source = Path(scheduler.origin).read_text()
    flush = source[source.index("    def flush_cache(") :]
    flush = flush[: flush.index("\n    def ")]
    assert "if self.is_fully_idle(" in flush and "self.tree_cache.reset()" in flush
