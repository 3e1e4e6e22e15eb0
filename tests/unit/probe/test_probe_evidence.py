"""The engines' counts a verdict rests on (`dsv4_engine.probe.evidence`, `kv_canary`), read
from pages as sglang-router 0.3.2 serves them (names with `_`, a `worker_addr` per sample)
and as an engine serves its own (names with `:`)."""

from __future__ import annotations

import pytest

from dsv4_engine import kv_canary
from dsv4_engine.engine_metrics import labelled
from dsv4_engine.probe.evidence import (
    PoolSizes,
    host_tokens_read,
    prompt_token_bound,
    proven_exercised,
    read,
)

PREFILL = "http://127.1.128.2:30000"
DECODE = "http://127.1.128.1:30000"


def page(engine_type: str, host: int, *, armed: bool = True, device_pool: int = 8192) -> str:
    """An engine's own page, as the reference engine and the SGLang plugin serve it."""
    base = f'model_name="m",engine_type="{engine_type}"'
    lines = [
        "# HELP sglang:cached_tokens_total Number of cached prompt tokens by source.",
        "# TYPE sglang:cached_tokens_total counter",
        f'sglang:cached_tokens_total{{{base},cache_source="device"}} 99',
        f'sglang:cached_tokens_total{{{base},cache_source="host"}} {host}',
        "# TYPE sglang:max_total_num_tokens gauge",
        f"sglang:max_total_num_tokens{{{base}}} {device_pool}",
        "# TYPE sglang:hicache_host_total_tokens gauge",
        f"sglang:hicache_host_total_tokens{{{base}}} {2 * device_pool}",
        "# TYPE dsv4:kv_canary_violations_total counter",
        f'dsv4:kv_canary_violations_total{{{base},launch_tag="KV_READ",fail_reason="x"}} 0',
    ]
    if armed:
        lines += ["# TYPE dsv4:kv_canary_armed gauge", f"dsv4:kv_canary_armed{{{base}}} 1"]
    return "\n".join(lines) + "\n"


def router_page(prefill: str, decode: str | None) -> str:
    """What sglang-router's GET /engine_metrics makes of the two pages."""
    pages = [labelled(prefill, PREFILL)]
    if decode is not None:
        pages.append(labelled(decode, DECODE))
    return "".join(pages)


def test_host_tier_reads_are_counted_on_the_prefix_matching_side_only():
    """A PD decode server counts the prefill's host tokens again (from the transfer's
    metadata): only the prefill side is read, through the router and on an engine's own page."""
    before = read(router_page(page("prefill", 100), page("decode", 100)))
    after = read(router_page(page("prefill", 1380), page("decode", 1380)))
    assert host_tokens_read(before, after) == 1280
    own = read(page("unified", 640)), read(page("unified", 1920))
    assert host_tokens_read(*own) == 1280
    assert after.pool == PoolSizes(device=8192, host=16384)
    assert after.pool.working_set == 12288


def test_an_engine_that_restarted_counts_from_zero():
    assert host_tokens_read(read(page("prefill", 5000)), read(page("prefill", 300))) == 300


@pytest.mark.parametrize(
    ("host", "judged", "unjudged", "proven"),
    [
        (0, [500, 500], 0, 0),
        (1, [500, 500], 0, 1),
        (900, [500, 500, 400], 0, 2),  # the largest first: 500 + 500 hold 900
        (1000, [100, 1000, 100], 0, 1),
        (1200, [500, 500, 100], 0, 0),  # more than the requests could hold: nothing proven
        (900, [500, 500, 400], 600, 1),  # the unjudged may have read 600 of it
        (900, [500, 500, 400], 900, 0),
    ],
)
def test_the_fewest_judged_requests_that_can_hold_the_host_tokens(host, judged, unjudged, proven):
    assert proven_exercised(host, judged, unjudged) == proven


def test_an_unanswered_prompt_is_taken_at_the_most_it_can_be():
    body = {"messages": [{"role": "user", "content": "é" * 100}], "tools": None}
    assert prompt_token_bound(body) >= 200 + 4096  # 2 bytes a character, the template


def test_a_router_page_vouches_for_kv_canary_only_with_every_engine_armed():
    armed = router_page(page("prefill", 0), page("decode", 0))
    assert kv_canary.unread(armed) is None
    assert kv_canary.read(armed) == {
        (PREFILL, "KV_READ", "x"): 0,
        (DECODE, "KV_READ", "x"): 0,
    }
    decode_dark = router_page(page("prefill", 0), page("decode", 0, armed=False))
    assert kv_canary.unread(decode_dark) == (
        f"{DECODE}: no dsv4_kv_canary_armed (its kv-canary check is not counted)"
    )
    # The router left the decode's page out (it could not parse it): the pair is not whole.
    dropped = router_page(page("prefill", 0), None)
    assert kv_canary.unread(dropped) == (
        "no decode engine's page (the router left it out, or it never answered)"
    )
    assert "no engine on the page" in kv_canary.unread("")
