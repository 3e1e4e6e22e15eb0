"""What judging every served tool-call answer costs the reference engine (issue 58 item 2):
judging off and on in one run, tool-call traffic at concurrency 64.

Two `dsv4-engine serve --reference-model echo` processes on loopback, one with
``DSV4_LIVE_JUDGE=off``, one with judging on (the default); rounds alternate between them
(off then on, then on then off, ...), each round with fresh processes, so both see the
same machine load.  Each request is the probes' echo request (a tool call of ~110 tokens
after a ~1,700-token prompt), half of them streamed.  Per engine it prints:

* CPU seconds per request: the server process's CPU time (user + system, every thread:
  the judge's worker included, from /proc) over the run, divided by the requests;
* p50 and p99 latency of the requests, as the client sees them;
* the answers its /metrics page counted, by outcome (the on engine judges every one).

Then the differences (targets: at most +2% CPU per request, at most +1 ms p99), each
round's too: on a shared machine two runs of the same engine differ by more than judging
costs, so the judge's own cost is also measured directly, in this process, on an answer
the engine served: the CPU its worker spends judging it, and what the response path spends
handing it over (`LiveJudge.submit`, and for a stream joining its deltas), against the
engine's CPU per request with judging off; and how long the judge's worker can hold up an
asyncio event loop (what serves the answers) while bursts of 64 such answers are judged at
once: the longest and the 99.9th-percentile gap between the loop's turns, judging off and
on.  Last, the validator's throughput on long
outputs (`dsv4_engine.live_judge.judge` on prose and an argument value of 4k to 32k words,
and a loop cut by max_tokens), which is what its worker does per answer.

Prints numbers, asserts nothing.  ``--requests N`` per engine per round, ``--rounds R``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import time
import urllib.request
from typing import Any

import aiohttp
from bench_engine_server import start as start_server

from dsv4_engine import live_judge
from dsv4_engine.probe.dsml_format import DsmlFormat
from dsv4_engine.probe.workload import ECHO_TOOL, echo_instruction, random_echo

CONCURRENCY = 64
CPU_TARGET = 0.02
P99_TARGET_MS = 1.0


def start(env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    """An echo engine with room for the whole concurrency, in ``env``."""
    flags = ("--reference-model", "echo", "--max-running-requests", str(CONCURRENCY))
    return start_server(*flags, env=env)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bodies(n: int, seed: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        echo = random_echo(random.Random(f"{seed}:{i}"))
        out.append({
            "messages": [{"role": "user", "content": echo_instruction(echo)}],
            "tools": [ECHO_TOOL],
            "max_tokens": 400,
            "stream": i % 2 == 1,
        })  # fmt: skip
    return out


async def one(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> float:
    t0 = time.perf_counter()
    async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}")
    return time.perf_counter() - t0


async def load(url: str, work: list[dict[str, Any]]) -> list[float]:
    gate = asyncio.Semaphore(CONCURRENCY)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=1200)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:

        async def gated(body: dict[str, Any]) -> float:
            async with gate:
                return await one(http, url, body)

        return list(await asyncio.gather(*(gated(b) for b in work)))


def outcomes(url: str) -> dict[str, int]:
    page = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    out = {}
    for line in page.splitlines():
        if line.startswith(live_judge.METRIC + "{"):
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            if (n := int(float(line.rsplit(" ", 1)[1]))) > 0:
                out[outcome] = n
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def served_answer(url: str) -> tuple[live_judge.Answer, list[dict[str, Any]]]:
    """One echo answer as the engine served it (non-streamed), and the choices of the same
    request streamed."""
    (body,) = bodies(1, seed=99)
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    reply = json.loads(urllib.request.urlopen(request, timeout=300).read())
    choice = reply["choices"][0]
    answer = live_judge.Answer(choice["message"], choice["finish_reason"], body["tools"],
                               body["messages"], reply["usage"]["completion_tokens"])  # fmt: skip
    request = urllib.request.Request(
        f"{url}/v1/chat/completions", json.dumps({**body, "stream": True}).encode(),
        {"Content-Type": "application/json"},
    )  # fmt: skip
    text = urllib.request.urlopen(request, timeout=300).read().decode()
    choices = [
        json.loads(line[6:])["choices"][0]
        for line in text.splitlines()
        if line.startswith("data: {") and '"choices": [{' in line
    ]
    return answer, choices


def direct_cost(
    answer: live_judge.Answer, choices: list[dict[str, Any]], n: int = 300
) -> tuple[float, float, float, str]:
    """The judge's CPU per answer (its worker), and the response path's share."""
    live_judge.judge(answer, DsmlFormat.V4)  # compiled tool validators cached, as served
    t0 = time.process_time()
    for _ in range(n):
        outcome, _ = live_judge.judge(answer, DsmlFormat.V4)
    worker = (time.process_time() - t0) / n
    judge = live_judge.LiveJudge(
        DsmlFormat.V4, queue_size=n + 1, judge_fn=lambda a, f: ("VALID", "")
    )
    t0 = time.perf_counter()
    for _ in range(n):
        judge.submit(answer)
    submit = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for _ in range(n):
        joined = live_judge.StreamedMessage()
        for choice in choices:
            joined.add_choice(choice)
        joined.message()
    join = (time.perf_counter() - t0) / n
    judge.drain()
    judge.stop()
    return worker, submit, join, outcome


async def _turns(stop: asyncio.Event) -> list[float]:
    gaps = []
    while not stop.is_set():
        t0 = time.perf_counter()
        await asyncio.sleep(0)
        gaps.append(time.perf_counter() - t0)
    return gaps


async def _bursts(judge: live_judge.LiveJudge | None, answer: live_judge.Answer) -> list[float]:
    stop = asyncio.Event()
    turns = asyncio.create_task(_turns(stop))
    await asyncio.sleep(0.01)
    for _ in range(5):
        for _ in range(CONCURRENCY):
            if judge is not None:
                judge.submit(answer)
        await asyncio.sleep(0.05)
    if judge is not None:
        await asyncio.to_thread(judge.drain)
    stop.set()
    return sorted(await turns)


def loop_stall(answer: live_judge.Answer, repeats: int = 3) -> None:
    print(f"== event-loop turns while 5 bursts of {CONCURRENCY} answers are judged "
          f"({repeats} times each, off and on alternating)")  # fmt: skip
    results: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
    for _ in range(repeats):
        for name in results:
            judge = live_judge.LiveJudge(DsmlFormat.V4) if name == "on" else None
            gaps = asyncio.run(_bursts(judge, answer))
            results[name].append((gaps[-1], pct(gaps, 0.999)))
            if judge is not None:
                judge.stop()
    for name, runs in results.items():
        longest = sorted(r[0] for r in runs)
        tail = sorted(r[1] for r in runs)
        print(f"judging {name:3s}: longest gap {', '.join(f'{g * 1e3:.2f}' for g in longest)} ms "
              f"(median {longest[len(runs) // 2] * 1e3:.2f}), 99.9th percentile median "
              f"{tail[len(runs) // 2] * 1e3:.3f} ms")  # fmt: skip


def long_outputs() -> dict[str, live_judge.Answer]:
    """Long served answers: prose and a long argument value of 4k to 32k words (~6
    characters each), and a loop cut by max_tokens."""
    rng = random.Random(5)
    words = "the of river ledger copper harbor winter signal garden lantern orbit".split()

    def prose(tokens: int) -> str:
        return " ".join(rng.choice(words) for _ in range(tokens))

    note = {"note": {"type": "string"}}
    function = ECHO_TOOL["function"]
    params = function["parameters"]
    params = {**params, "properties": {**params["properties"], **note}}
    tool = [{**ECHO_TOOL, "function": {**function, "parameters": params}}]
    msgs = [{"role": "user", "content": "Store the report."}]
    out = {}
    for tokens in (4096, 16384, 32768):
        out[f"prose {tokens // 1024}k words"] = live_judge.Answer(
            {"role": "assistant", "content": prose(tokens)}, "stop", tool, msgs, tokens
        )
        args = {**random_echo(rng).args, "note": prose(tokens)}
        call = {"id": "c", "type": "function",
                "function": {"name": ECHO_TOOL["function"]["name"], "arguments": json.dumps(args)}}  # fmt: skip
        out[f"argument value {tokens // 1024}k words"] = live_judge.Answer(
            {"role": "assistant", "content": "", "tool_calls": [call]}, "tool_calls", tool, msgs,
            tokens,
        )  # fmt: skip
    loop = ("The harbor signal repeats until the winter ledger closes. " * 2000)[: 32768 * 4]
    out["loop cut by max_tokens 128k chars"] = live_judge.Answer(
        {"role": "assistant", "content": loop}, "length", tool, msgs, 32768
    )
    return out


def validator_throughput() -> None:
    print("== the validator on long outputs (live_judge.judge, one answer, best of 3)")
    for name, answer in long_outputs().items():
        chars = len(json.dumps(answer.message, ensure_ascii=False))
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            outcome, _ = live_judge.judge(answer, DsmlFormat.V4)
            best = min(best, time.perf_counter() - t0)
        print(f"{name:36s} {chars / 1e3:7.1f} kB  {best * 1e3:7.1f} ms  "
              f"{chars / best / 1e6:6.2f} MB/s  -> {outcome}")  # fmt: skip


ENVS = {"off": {live_judge.SWITCH_ENV: "off"}, "on": {}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=192, help="per engine per round")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    latencies: dict[str, list[float]] = {k: [] for k in ENVS}
    per_round: dict[str, list[tuple[float, float]]] = {k: [] for k in ENVS}
    cpu: dict[str, float] = dict.fromkeys(ENVS, 0.0)
    count: dict[str, int] = dict.fromkeys(ENVS, 0)
    counted: dict[str, dict[str, int]] = {k: {} for k in ENVS}
    for r in range(args.rounds):
        # Fresh processes each round, started and measured off first, then on first: where
        # the OS places them and what else runs then is shared out between both.
        names = list(ENVS) if r % 2 == 0 else list(ENVS)[::-1]
        engines = {name: start(ENVS[name]) for name in names}
        try:
            for _, url in engines.values():  # warm both (first-request costs)
                asyncio.run(load(url, bodies(CONCURRENCY, seed=-1)))
            for name in names:
                proc, url = engines[name]
                work = bodies(args.requests, seed=r)
                before = cpu_seconds(proc.pid)
                lat = asyncio.run(load(url, work))
                time.sleep(0.5)  # the judge's queue drains (its CPU counted too)
                used = cpu_seconds(proc.pid) - before
                per_round[name].append((used / len(work), pct(lat, 0.99)))
                latencies[name] += lat
                cpu[name] += used
                count[name] += len(work)
                for outcome, n in outcomes(url).items():
                    counted[name][outcome] = counted[name].get(outcome, 0) + n
            if r == args.rounds - 1:
                answer, choices = served_answer(engines["on"][1])
        finally:
            for proc, _ in engines.values():
                proc.terminate()
                proc.wait()
    print(f"== reference engine, echo tool calls, concurrency {CONCURRENCY}, "
          f"{args.rounds} rounds x {args.requests} requests per engine (half streamed)")  # fmt: skip
    rows = {}
    for name in ENVS:
        per = cpu[name] / count[name]
        lat = latencies[name]
        rows[name] = (per, pct(lat, 0.5), pct(lat, 0.99))
        print(f"judging {name:3s}: {per * 1e3:7.2f} ms CPU/request  p50 "
              f"{rows[name][1] * 1e3:8.1f} ms  p99 {rows[name][2] * 1e3:8.1f} ms  "
              f"counted {counted[name] or '-'}")  # fmt: skip
    for r in range(args.rounds):
        (a, qa), (b, qb) = per_round["off"][r], per_round["on"][r]
        print(f"  round {r + 1}: CPU/request off {a * 1e3:6.2f} on {b * 1e3:6.2f} ms "
              f"({(b - a) / a * 100:+.1f}%), p99 off {qa * 1e3:7.1f} on {qb * 1e3:7.1f} ms")  # fmt: skip
    diffs = sorted((b[0] - a[0]) / a[0] for a, b in zip(*per_round.values(), strict=True))
    print(f"  median round: CPU/request {diffs[len(diffs) // 2] * 100:+.1f}%")
    (c0, _, q0), (c1, _, q1) = rows["off"], rows["on"]
    print(f"difference: CPU/request {(c1 - c0) / c0 * 100:+.2f}% (target <= "
          f"+{CPU_TARGET * 100:.0f}%), p99 {(q1 - q0) * 1e3:+.1f} ms (target <= "
          f"+{P99_TARGET_MS:.0f} ms); p50 {(rows['on'][1] - rows['off'][1]) * 1e3:+.1f} ms")  # fmt: skip
    worker, submit, join, outcome = direct_cost(answer, choices)
    print(f"== the judge's own cost on a served echo answer ({answer.completion_tokens} "
          f"tokens, {outcome}; streamed: {len(choices)} chunks)")  # fmt: skip
    print(f"worker CPU per answer {worker * 1e3:.3f} ms = {worker / c0 * 100:.2f}% of the "
          f"engine's CPU per request with judging off ({c0 * 1e3:.2f} ms)")  # fmt: skip
    print(f"on the response path: submit {submit * 1e6:.1f} us, joining a stream's deltas "
          f"{join * 1e6:.1f} us (= {(submit + join) / c0 * 100:.3f}% CPU; at most that "
          f"added to a request's latency, plus the worker holding the GIL while it judges: "
          f"{worker * 1e3:.3f} ms per answer)")  # fmt: skip
    loop_stall(answer)
    validator_throughput()


if __name__ == "__main__":
    main()
