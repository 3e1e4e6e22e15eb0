"""Benchmark of the tool-call probes against an engine that truly corrupts: `make bench-echo`.

A PD slice of the CPU reference engine as the canary runs it (prefill, decode and
sglang-router, the router the operator deploys; HiCache + bf16 index-K, the canary's
capped device pool) serving the echo model, probed by `dsv4ctl probe`'s runner with the
default probe set for that model (the three tool-call echo probes and prefix-reuse
consistency) at concurrency 64, as a canary's probe is: reading prefixes back from the host
tier by eviction.  The index-K race is injected into a share of the host-tier loads
(DSV4_INJECT_UNGATED_INDEX_K=<share>):

1. aim: the corruption rate with every load raced, measured over a fixed budget; the
   share for a target rate is searched between the shares measured so far (share 0 is
   gated, rate 0), a few tries at most (the rate grows with the share, far from in
   proportion), and the rate measured at the share used is printed;
2. for targets around 5%, 15% and 50%: the rate measured at that share, then the judged
   samples and seconds until the production rule (0.5% at 95%) says FAIL, median of runs;
3. the gated engine (no fault): seconds to PASS at the production default (598 samples).

Prints one table; asserts nothing.  Takes three to four minutes on two cores (the gated PASS
about half a minute); docs/rollout.md has a measured run.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dsv4_dev import sglang_router
from dsv4_engine.engine_config import Backend
from dsv4_engine.probe import ProbeSettings, Verdict, run_probes
from dsv4_engine.probe.runner import ProbeResult
from dsv4_engine.probe.stats import minimum_samples
from dsv4_operator.api.rollout import CanarySpec

THRESHOLD, CONFIDENCE, CONCURRENCY = 0.005, 0.95, 64
TARGETS = (0.05, 0.15, 0.50)
CALIBRATION_SAMPLES = 160
FAIL_RUNS = 3
FLAGS = (
    "--reference-model", "echo", "--enable-hierarchical-cache", "--hicache-ratio", "2",
    "--index-dtype", "bf16",
    "--max-total-tokens", str(CanarySpec().pool_tokens(Backend.REFERENCE)),
)  # fmt: skip
_port = sglang_router.free_port


def _ready(url: str, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"{url} not ready after {timeout_s:.0f}s")


@contextmanager
def pd_slice(share: float) -> Iterator[str]:
    """Prefill, decode and router processes; the router's URL."""
    env = {**os.environ, "DSV4_INJECT_UNGATED_INDEX_K": f"{share:g}"}
    cli = [sys.executable, "-m", "dsv4_engine.cli"]
    procs: list[subprocess.Popen] = []

    def start(*args: str) -> str:
        port = _port()
        procs.append(
            subprocess.Popen([*cli, *args, "--port", str(port)], env=env, stdout=subprocess.DEVNULL)
        )
        url = f"http://127.0.0.1:{port}"
        _ready(url, procs[-1])
        return url

    try:
        bootstrap = str(_port())
        prefill = start("serve", *FLAGS, "--disaggregation-mode", "prefill",
                        "--disaggregation-bootstrap-port", bootstrap)  # fmt: skip
        decode = start("serve", *FLAGS, "--disaggregation-mode", "decode")
        args = sglang_router.pd_args(prefill, int(bootstrap), decode)
        with tempfile.TemporaryDirectory() as logs:
            with sglang_router.running(args, Path(logs) / "router.log") as url:
                yield url
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)


def probe(url: str, threshold: float, requests: int | None, seed: int) -> tuple[ProbeResult, float]:
    settings = ProbeSettings(
        base_url=url,
        backend="reference",
        concurrency=CONCURRENCY,
        requests=requests,
        max_corruption_rate=threshold,
        confidence=CONFIDENCE,
        seed=seed,
        hicache=True,
    )
    start = time.monotonic()
    result = asyncio.run(run_probes(settings))
    return result, time.monotonic() - start


def measured_rate(share: float) -> float:
    """The corruption rate at `share` over a fixed budget (a threshold no rate reaches)."""
    with pd_slice(share) as url:
        result, _ = probe(url, 0.99, CALIBRATION_SAMPLES, seed=1000)
    return result.rate


AIM_TRIES = 4
"""Shares tried per target at most; each costs one calibration run (~10 s)."""


def aim(target: float, full: float) -> tuple[float, float]:
    """A share whose rate is within a quarter of `target`, or the closest of the tries,
    and that rate.  Each try interpolates linearly between the nearest measured shares
    below and above the target (share 0: rate 0; share 1: `full`): the rate is far from
    proportional to the share, so a single proportional correction overshoots."""
    points = [(0.0, 0.0), (1.0, full)]
    best = (1.0, full)
    for _ in range(AIM_TRIES):
        lo = max((p for p in points if p[1] <= target), key=lambda p: p[1])
        hi = min((p for p in points if p[1] > target), key=lambda p: p[1], default=(1.0, full))
        if hi[1] <= lo[1]:
            break  # share 1 does not reach the target: it is the closest there is
        share = lo[0] + (hi[0] - lo[0]) * (target - lo[1]) / (hi[1] - lo[1])
        rate = measured_rate(share)
        points.append((share, rate))
        if abs(rate - target) < abs(best[1] - target):
            best = (share, rate)
        if abs(rate - target) <= target / 4:
            break
    return best


def until_fail(share: float) -> list[tuple[int, float, str]]:
    """(judged samples, seconds, verdict) of runs at the production defaults; a run that
    does not FAIL prints why (a loaded machine times requests out: INCONCLUSIVE)."""
    runs = []
    with pd_slice(share) as url:
        for seed in range(FAIL_RUNS):
            result, seconds = probe(url, THRESHOLD, None, seed)
            runs.append((result.judged, round(seconds, 1), result.verdict.value))
            if result.verdict is not Verdict.FAIL:
                print(f"    share {share:.3f}, seed {seed}: {'; '.join(result.reasons)}")
    return runs


def main() -> None:
    print(f"aim: every host-tier load raced (share 1), {CALIBRATION_SAMPLES} samples ...")
    full = measured_rate(1.0)
    print(f"  corruption rate at share 1: {full:.1%}")
    rows = []
    for target in TARGETS:
        share, rate = aim(target, full)
        runs = until_fail(share)
        failed = [r for r in runs if r[2] == Verdict.FAIL.value]
        rows.append((target, share, rate, runs, failed))
        print(f"  target {target:.0%}: share {share:.3f}, measured {rate:.1%}, runs {runs}")
    with pd_slice(0.0) as url:
        gated, pass_s = probe(url, THRESHOLD, None, seed=2000)
    budget = minimum_samples(THRESHOLD, CONFIDENCE)
    print("\nEcho model, PD slice, HiCache + bf16, concurrency 64; FAIL/PASS at 0.5% / 95%")
    print(f"{'target':>7} {'share':>6} {'measured':>9} {'median samples':>15} {'median s':>9}")
    for target, share, rate, runs, failed in rows:
        samples = statistics.median(r[0] for r in failed) if failed else float("nan")
        seconds = statistics.median(r[1] for r in failed) if failed else float("nan")
        print(
            f"{target:>7.0%} {share:>6.3f} {rate:>9.1%} {samples:>15.0f} {seconds:>9.1f}"
            f"   ({len(failed)}/{len(runs)} runs FAIL)"
        )
    print(
        f"gated: {gated.verdict.value} after {gated.judged} judged samples "
        f"(budget {budget}) in {pass_s:.0f} s = {gated.judged / pass_s:.1f} samples/s"
    )


if __name__ == "__main__":
    main()
