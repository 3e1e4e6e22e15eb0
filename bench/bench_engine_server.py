"""Reference engine server throughput (requests/s, tokens/s at concurrency 1/16/64), HiCache
on vs off for long shared prefixes, and warm != cold rates with the index-K gate removed.

Starts real `dsv4-engine serve` processes on loopback; prints numbers, asserts nothing.
`--no-race` skips the (slowest) warm != cold section.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import urllib.request

import aiohttp

from dsv4_engine.reference.loadgen import run_all, shared_prefix_bodies, warm_vs_cold


def start(*flags: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "dsv4_engine.cli", "serve", "--port", str(port), *flags]
    proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2)
            return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise TimeoutError("server not ready")


async def throughput(url: str, concurrency: int, bodies: list) -> tuple[float, float, float]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        t0 = time.monotonic()
        answers = await run_all(http, url, bodies, concurrency)
        wall = time.monotonic() - t0
    tokens = sum(a.completion_tokens for a in answers)
    mean_latency = sum(a.latency_s for a in answers) / len(answers)
    return len(answers) / wall, tokens / wall, mean_latency


async def hit_and_latency(url: str, bodies: list) -> float:
    """Mean latency of the sessions, four at a time, groups in round robin."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        answers = await run_all(http, url, bodies, 4)
    return sum(a.latency_s for a in answers) / len(answers)


def main() -> None:
    print("== throughput (no HiCache, distinct ~300-token prompts, 16 new tokens)")
    proc, url = start()
    try:
        for c in (1, 16, 64):
            bodies = shared_prefix_bodies(max(c, 8), max(c, 8), 40, 16, seed=c)
            rps, tps, lat = asyncio.run(throughput(url, c, bodies))
            print(
                f"concurrency {c:3d}: {rps:6.2f} req/s  {tps:7.1f} tok/s  mean latency {lat:.2f}s"
            )
    finally:
        proc.terminate()
        proc.wait()
    print("== long shared prefixes (8 groups of ~1400 tokens > the 64-page device pool)")
    bodies = shared_prefix_bodies(64, 8, 200, 8, seed=7)
    small = ("--max-total-tokens", "8192")
    for label, flags in (
        ("off", small),
        ("on ", (*small, "--enable-hierarchical-cache", "--hicache-ratio", "4")),
    ):
        proc, url = start(*flags)
        try:
            lat = asyncio.run(hit_and_latency(url, bodies))
            with urllib.request.urlopen(f"{url}/metrics") as resp:
                rate = [ln for ln in resp.read().decode().splitlines()
                        if ln.startswith("sglang:cache_hit_rate")][0].split()[-1]  # fmt: skip
            print(f"HiCache {label}: cache_hit_rate {float(rate):.2f}  mean latency {lat:.2f}s")
        finally:
            proc.terminate()
            proc.wait()
    if "--no-race" in sys.argv:
        return
    print("== warm != cold, 64 sessions, gated vs DSV4_INJECT_UNGATED_INDEX_K=1")
    race_bodies = shared_prefix_bodies(64, 8, 60, 8, seed=0, session_words=40)
    runs = [(d, inj, "2") for d in ("fp8", "bf16") for inj in ("0", "1")]
    runs += [("fp8", "1", "3"), ("bf16", "1", "3")]  # a shorter copy window
    for dtype, injected, bandwidth in runs:
        proc, url = start(
            "--enable-hierarchical-cache", "--hicache-ratio", "2", "--hicache-bandwidth", bandwidth,
            "--index-dtype", dtype, env={"DSV4_INJECT_UNGATED_INDEX_K": injected},
        )  # fmt: skip
        try:
            cold, warm = asyncio.run(warm_vs_cold(url, race_bodies))
            bad = sum(c.text != w.text for c, w in zip(cold, warm, strict=True))
            gate = "ungated" if injected == "1" else "gated  "
            print(
                f"{dtype:4s} {gate} {bandwidth} MB/s: {bad}/64 warm answers differ ({bad / 64:.0%})"
            )
        finally:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
