"""PD disaggregation: prefill and decode servers behind the router serve exactly the
answers one `null` server does, for the same requests (pages move byte for byte)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from dsv4_engine.reference.loadgen import run_all, shared_prefix_bodies

pytestmark = pytest.mark.slow

BODIES = shared_prefix_bodies(16, prefixes=4, prefix_words=60, max_tokens=8, seed=3)
HICACHE = ("--enable-hierarchical-cache", "--hicache-ratio", "2", "--index-dtype", "bf16")


async def answers(url: str) -> list[str]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        first = await run_all(http, url, BODIES, 16)
        again = await run_all(http, url, BODIES, 16)  # prefix-cache hits on the prefill side
    assert [a.text for a in again] == [a.text for a in first]
    return [a.text for a in first]


def test_pd_serves_the_same_answers_as_null(start_server, free_port):
    null = start_server(*HICACHE)
    bootstrap = free_port()
    prefill = start_server(
        *HICACHE, "--disaggregation-mode", "prefill",
        "--disaggregation-bootstrap-port", str(bootstrap),
    )  # fmt: skip
    decode = start_server("--disaggregation-mode", "decode", "--index-dtype", "bf16")
    router = start_server("--prefill", prefill, str(bootstrap), "--decode", decode, cmd="router")
    assert asyncio.run(answers(router)) == asyncio.run(answers(null))


def test_through_pd_the_answer_reports_the_prefill_sides_host_tier_reads(start_server, free_port):
    """The prefix cache and its host tier live on the prefill server; the answer comes from
    the decode server, which reports the prefill's counts (as SGLang's decode does from the
    transfer's metadata), so a probe through the router sees the host-tier read."""
    bootstrap = free_port()
    prefill = start_server(
        *HICACHE, "--disaggregation-mode", "prefill",
        "--disaggregation-bootstrap-port", str(bootstrap),
    )  # fmt: skip
    decode = start_server("--disaggregation-mode", "decode", "--index-dtype", "bf16")
    router = start_server("--prefill", prefill, str(bootstrap), "--decode", decode, cmd="router")
    body = {**BODIES[0], "return_cached_tokens_details": True}

    async def cold_then_warm() -> tuple[dict, dict]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
            async with http.post(f"{router}/v1/chat/completions", json=body) as resp:
                cold = await resp.json()
            async with http.post(f"{router}/admin/hicache/offload", json={}) as resp:
                assert resp.status == 200
            async with http.post(f"{router}/v1/chat/completions", json=body) as resp:
                return cold, await resp.json()

    cold, warm = asyncio.run(cold_then_warm())
    assert "sglext" not in cold
    host = warm["sglext"]["cached_tokens_details"]["host"]
    assert host == warm["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert metric(prefill, "sglang:load_back_tokens_total") == host


def test_decode_server_without_a_prefill_refuses_with_400(start_server):
    decode = start_server("--disaggregation-mode", "decode")

    async def post() -> tuple[int, str]:
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{decode}/v1/chat/completions", json=BODIES[0]) as resp:
                return resp.status, (await resp.json())["error"]["message"]

    status, message = asyncio.run(post())
    assert status == 400 and "bootstrap_host" in message


def metric(url: str, name: str) -> float:
    async def get() -> str:
        async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as resp:
            return await resp.text()

    line = next(ln for ln in asyncio.run(get()).splitlines() if ln.startswith(name))
    return float(line.rsplit(" ", 1)[1])


def test_a_decode_engine_refuses_pages_of_another_transfer_format(start_server, free_port):
    """Promoting fp8 → fp4 role by role would pair exactly these: the decode engine refuses
    the transfer (502, saying what differs) and counts it, instead of reading bytes of
    another shape.  The operator promotes such a change in pairs, so this never happens."""
    bootstrap = free_port()
    prefill = start_server(
        "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(bootstrap),
        "--index-dtype", "fp8",
    )  # fmt: skip
    decode = start_server("--disaggregation-mode", "decode", "--index-dtype", "fp4")
    router = start_server("--prefill", prefill, str(bootstrap), "--decode", decode, cmd="router")

    async def post() -> tuple[int, str]:
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{router}/v1/chat/completions", json=BODIES[0]) as resp:
                return resp.status, (await resp.json())["error"]["message"]

    status, message = asyncio.run(post())
    assert status == 502
    assert "transfer format mismatch (index_dtype: prefill 'fp8', decode 'fp4')" in message
    assert metric(decode, "dsv4:pd_transfer_format_mismatch_total") == 1
