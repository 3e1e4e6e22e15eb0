"""PD disaggregation behind the router the operator deploys (sglang-router 0.3.2, the real
binary, sending each request to both servers with a bootstrap room): prefill and decode
servers serve exactly the answers one `null` server does, for the same requests (pages
move byte for byte through the room), and count what the probe reads through the router."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import aiohttp
import pytest

from dsv4_engine.probe.evidence import read
from dsv4_engine.reference.loadgen import run_all, shared_prefix_bodies
from tests.real_router import router

pytestmark = pytest.mark.slow

BODIES = shared_prefix_bodies(16, prefixes=4, prefix_words=60, max_tokens=8, seed=3)
HICACHE = ("--enable-hierarchical-cache", "--hicache-ratio", "2", "--index-dtype", "bf16")


async def answers(url: str) -> list[str]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        first = await run_all(http, url, BODIES, 16)
        again = await run_all(http, url, BODIES, 16)  # prefix-cache hits on the prefill side
    assert [a.text for a in again] == [a.text for a in first]
    return [a.text for a in first]


@contextlib.contextmanager
def pd_pair(
    start_server, free_port, tmp_path, *prefill_flags: str, decode_flags=()
) -> Iterator[tuple[str, str, str]]:
    """(router, prefill, decode): the real router in front of a reference PD pair."""
    bootstrap = free_port()
    prefill = start_server(
        *prefill_flags, "--disaggregation-mode", "prefill",
        "--disaggregation-bootstrap-port", str(bootstrap),
    )  # fmt: skip
    decode = start_server("--disaggregation-mode", "decode", *decode_flags)
    args = ["--pd-disaggregation", "--prefill", prefill, str(bootstrap), "--decode", decode]
    with router(args, tmp_path / "router.log") as url:
        yield url, prefill, decode


def test_pd_serves_the_same_answers_as_null(start_server, free_port, tmp_path):
    null = start_server(*HICACHE)
    with pd_pair(
        start_server, free_port, tmp_path, *HICACHE, decode_flags=("--index-dtype", "bf16")
    ) as (url, _, _):
        assert asyncio.run(answers(url)) == asyncio.run(answers(null))


def test_through_pd_the_router_page_counts_the_prefill_sides_host_tier_reads(
    start_server, free_port, tmp_path
):
    """The prefix cache and its host tier live on the prefill server: it counts the prompt
    tokens a request read back from there, and the decode server counts them again from
    the transfer (as SGLang's decode does from the transfer's metadata).  Through the
    router's /engine_metrics the probe reads the prefill side's alone."""
    with pd_pair(
        start_server, free_port, tmp_path, *HICACHE, decode_flags=("--index-dtype", "bf16")
    ) as (url, prefill, _):

        async def cold_then_warm() -> tuple[dict, dict, str, str]:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
                async with http.get(f"{url}/engine_metrics") as resp:
                    before = await resp.text()
                async with http.post(f"{url}/v1/chat/completions", json=BODIES[0]) as resp:
                    cold = await resp.json(content_type=None)
                # The reference-only knob, on the prefill server itself (no router routes it).
                async with http.post(f"{prefill}/admin/hicache/offload", json={}) as resp:
                    assert resp.status == 200
                async with http.post(f"{url}/v1/chat/completions", json=BODIES[0]) as resp:
                    warm = await resp.json(content_type=None)
                async with http.get(f"{url}/engine_metrics") as resp:
                    return cold, warm, before, await resp.text()

        cold, warm, before, after = asyncio.run(cold_then_warm())
    assert warm["choices"][0]["message"] == cold["choices"][0]["message"]
    cached = warm["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0 and "sglext" not in warm  # the router dropped the request's field
    host = read(after).host_tokens
    assert list(host.values()) == [cached] and list(host) == [prefill]
    assert read(before).host_tokens == {prefill: 0}
    assert 'engine_type="decode",model_name="dsv4-reference",worker_addr="' in after


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


def test_a_decode_engine_refuses_pages_of_another_transfer_format(
    start_server, free_port, tmp_path
):
    """Promoting fp8 → fp4 role by role would pair exactly these: the decode engine refuses
    the transfer (502, saying what differs) and counts it, instead of reading bytes of
    another shape.  The operator promotes such a change in pairs, so this never happens."""
    with pd_pair(
        start_server, free_port, tmp_path, "--index-dtype", "fp8",
        decode_flags=("--index-dtype", "fp4"),
    ) as (url, _, decode):  # fmt: skip

        async def post() -> tuple[int, str]:
            async with aiohttp.ClientSession() as http:
                async with http.post(f"{url}/v1/chat/completions", json=BODIES[0]) as resp:
                    return resp.status, await resp.text()

        status, message = asyncio.run(post())
        assert status == 502
        assert "transfer format mismatch (index_dtype: prefill 'fp8', decode 'fp4')" in message
        # sglang-router 0.3.2 tries a request a worker failed five times in all (its
        # --retry-max-retries default; both servers, a new room each) before it answers the
        # error: each try is refused and counted.
        assert metric(decode, "dsv4:pd_transfer_format_mismatch_total") == 5
