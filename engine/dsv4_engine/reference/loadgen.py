"""Load for the reference engine: sessions over shared long prefixes, cold then warm.

Shared by the integration tests and `bench/bench_engine_server.py`, so the numbers a
benchmark prints and the behaviour a test asserts come from the same workload.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

WORDS = (
    "river ledger copper harbor winter signal garden lantern orbit meadow quarry engine "
    "canyon violet anchor marble thunder willow compass falcon ember glacier harvest island"
).split()


@dataclass(frozen=True)
class Answer:
    text: str
    latency_s: float
    completion_tokens: int
    cached_tokens: int


def shared_prefix_bodies(
    sessions: int,
    prefixes: int,
    prefix_words: int,
    max_tokens: int,
    seed: int = 0,
    session_words: int = 0,
) -> list[dict[str, Any]]:
    """One chat body per session; session i shares the system prompt of group i % prefixes,
    then has `session_words` of its own (pages only it caches and reloads)."""
    docs = []
    for g in range(prefixes):
        rng = random.Random(f"{seed}:prefix:{g}")
        docs.append(f"Document {g}: " + " ".join(rng.choices(WORDS, k=prefix_words)))
    bodies = []
    for i in range(sessions):
        rng = random.Random(f"{seed}:question:{i}")
        own = " ".join(rng.choices(WORDS, k=session_words))
        question = f"Session {i}: {own} continue. " + " ".join(rng.choices(WORDS, k=6))
        messages = [
            {"role": "system", "content": docs[i % prefixes]},
            {"role": "user", "content": question},
        ]
        bodies.append({"messages": messages, "max_tokens": max_tokens, "temperature": 0})
    return bodies


async def chat(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Answer:
    start = time.monotonic()
    async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
        reply = await resp.json()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {reply}")
    usage = reply.get("usage", {})
    return Answer(
        reply["choices"][0]["message"].get("content") or "",
        time.monotonic() - start,
        usage.get("completion_tokens", 0),
        usage.get("prompt_tokens_details", {}).get("cached_tokens", 0),
    )


async def run_all(
    http: aiohttp.ClientSession, url: str, bodies: list[dict[str, Any]], concurrency: int
) -> list[Answer]:
    """Every body once, at most `concurrency` in flight; answers in body order."""
    gate = asyncio.Semaphore(concurrency)

    async def one(body: dict[str, Any]) -> Answer:
        async with gate:
            return await chat(http, url, body)

    return list(await asyncio.gather(*(one(b) for b in bodies)))


async def offload(http: aiohttp.ClientSession, url: str) -> int:
    async with http.post(f"{url}/admin/hicache/offload", json={}) as resp:
        reply = await resp.json()
        if resp.status != 200:
            raise RuntimeError(f"offload: HTTP {resp.status}: {reply}")
    return int(reply["offloaded_tokens"])


async def warm_vs_cold(
    url: str, bodies: list[dict[str, Any]], timeout_s: float = 300.0
) -> tuple[list[Answer], list[Answer]]:
    """All sessions cold (concurrently), every prefix pushed to host, all again (warm)."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    # No keep-alive: a phase can outlast the server's idle timeout, and reusing a
    # connection the server just closed would look like a server failure.
    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        cold = await run_all(http, url, bodies, len(bodies))
        await offload(http, url)
        warm = await run_all(http, url, bodies, len(bodies))
    return cold, warm
