"""Benchmark of the probe client: `make bench-probe`.

Prints (1) samples/s of the whole probe loop (request, DSML parse, schema and echo check,
sequential statistics) at concurrency 64 against a trivial loopback server in another
process — the goal is ≥ 500/s, so the client is never the bottleneck of a real engine —
and (2) how many judged samples a verdict needs: to PASS at 0.5% / 95% (exact) and to FAIL
a 12% corruption rate (measured runs against the scripted server, and a 2000-run seeded
simulation of the sequential rule).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import random
import statistics
import time

from dsv4_engine.probe import ProbeName, ProbeSettings, Verdict, run_probes
from dsv4_engine.probe.dsml import EOS, DsmlFormat
from dsv4_engine.probe.dsml_format import render_dsml
from dsv4_engine.probe.scripted_server import ScriptedCompletionServer
from dsv4_engine.probe.stats import fail_now, samples_to_pass

THRESHOLD, CONFIDENCE, CONCURRENCY = 0.005, 0.95, 64


class TrivialEchoServer(asyncio.Protocol):
    """A bare HTTP/1.1 keep-alive loopback server that answers every chat request with the
    requested echo call: as cheap as a server can be, so the number measured is the
    client's.  (ScriptedCompletionServer, built on aiohttp.web, costs more per request than
    the probe client on a 2-core machine and would measure itself.)"""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport, self.buffer = transport, b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) != -1:
            head = self.buffer[:end].decode("latin-1")
            length = int(
                next(
                    (
                        ln.split(":")[1]
                        for ln in head.split("\r\n")
                        if ln.lower().startswith("content-length:")
                    ),
                    "0",
                )
            )
            if len(self.buffer) < end + 4 + length:
                return
            body, self.buffer = (
                self.buffer[end + 4 : end + 4 + length],
                self.buffer[end + 4 + length :],
            )
            self.transport.write(self._respond(head.split(" ", 2)[1], body))

    @staticmethod
    def _respond(path: str, body: bytes) -> bytes:
        if path == "/v1/models":
            payload: dict = {"data": [{"id": "trivial"}]}
        else:
            instruction = json.loads(body)["messages"][-1]["content"]
            args, _ = json.JSONDecoder().raw_decode(instruction[instruction.index("{") :])
            text = render_dsml(DsmlFormat.V4, "record_echo", args) + EOS
            payload = {"choices": [{"message": {"content": text}, "finish_reason": "stop"}]}
        raw = json.dumps(payload).encode()
        return (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(raw)).encode()
            + b"\r\n\r\n"
            + raw
        )


def _serve(queue: mp.Queue, corruption_rate: float, seed: int, trivial: bool) -> None:
    async def main() -> None:
        if trivial:
            loop = asyncio.get_running_loop()
            server = await loop.create_server(TrivialEchoServer, "127.0.0.1", 0, backlog=1024)
            queue.put(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        else:
            scripted = ScriptedCompletionServer(corruption_rate=corruption_rate, seed=seed)
            queue.put(await scripted.start())
        await asyncio.Event().wait()

    asyncio.run(main())


def _server(
    corruption_rate: float = 0.0, seed: int = 0, trivial: bool = False
) -> tuple[mp.Process, str]:
    queue: mp.Queue = mp.Queue()
    proc = mp.Process(target=_serve, args=(queue, corruption_rate, seed, trivial), daemon=True)
    proc.start()
    return proc, queue.get(timeout=30)


def _settings(url: str, requests: int) -> ProbeSettings:
    return ProbeSettings(
        base_url=url,
        probes=(ProbeName.TOOLCALL_ECHO,),
        concurrency=CONCURRENCY,
        requests=requests,
        max_corruption_rate=THRESHOLD,
        confidence=CONFIDENCE,
    )


def throughput() -> None:
    proc, url = _server(trivial=True)
    try:
        asyncio.run(run_probes(_settings(url, 500)))  # warm-up
        start, cpu = time.perf_counter(), time.process_time()
        result = asyncio.run(run_probes(_settings(url, 5000)))
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    finally:
        proc.terminate()
    rate = result.judged / elapsed
    per_sample_ms = 1000 * cpu / result.judged
    print(
        f"client CPU: {per_sample_ms:.2f} ms per sample, i.e. one core judges "
        f"{1000 / per_sample_ms:.0f} samples/s (the server process uses the other CPU time)"
    )
    print(
        f"throughput: {result.judged} samples in {elapsed:.2f} s = {rate:.0f} samples/s "
        f"(peak {result.peak_concurrency}, mean {result.mean_concurrency:.1f} in flight; "
        f"goal >= 500/s) {'OK' if rate >= 500 else 'BELOW GOAL'}; "
        f"machine load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )


def samples_to_decide() -> None:
    n0 = samples_to_pass(THRESHOLD, CONFIDENCE)
    n1 = samples_to_pass(THRESHOLD, CONFIDENCE, failures=1)
    print(
        f"PASS at {THRESHOLD:.1%}/{CONFIDENCE:.0%}: {n0} judged samples with 0 corrupt, "
        f"{n1} with 1 corrupt (default budget)"
    )
    proc, url = _server()
    try:
        result = asyncio.run(run_probes(_settings(url, n0)))
    finally:
        proc.terminate()
    print(
        f"  measured: {result.judged} samples -> {result.verdict} "
        f"(upper bound {result.upper_bound:.4%})"
    )
    assert result.verdict is Verdict.PASS
    fail_ats = []
    for seed in range(5):
        proc, url = _server(corruption_rate=0.12, seed=seed)
        try:
            result = asyncio.run(run_probes(_settings(url, 2000)))
        finally:
            proc.terminate()
        fail_ats.append(result.tally.fail_at)
    print(
        f"FAIL at 12% corruption, measured (5 seeds, concurrency {CONCURRENCY}): "
        f"fired after {fail_ats} judged samples"
    )
    rng, firsts = random.Random(0), []
    for _ in range(2000):
        failures, n = 0, 0
        while True:
            n += 1
            failures += rng.random() < 0.12
            if fail_now(failures, n, THRESHOLD, CONFIDENCE):
                break
        firsts.append(n)
    firsts.sort()
    print(
        f"FAIL at 12% corruption, simulated (2000 runs): median {statistics.median(firsts):.0f}, "
        f"p90 {firsts[1800]}, p99 {firsts[1980]}, max {firsts[-1]} judged samples"
    )


if __name__ == "__main__":
    throughput()
    samples_to_decide()
