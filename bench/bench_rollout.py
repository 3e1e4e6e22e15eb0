"""Rollout benchmark: on the shipped reference-engine sample with the production canary
defaults (598 clean samples, 0.5% at 95%), the time from a flag change to each verdict and
to the end of the rollout, the samples judged, and the API writes one rollout makes (the
operator's own counter).

Runs on the local world of `make demo` (real control plane, operator, local runtime with the
CPU reference engine): first the incident's flags with the index-K race injected (FAIL →
rolled back), then the same flags gated (PASS → promoted).  Prints one table.
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

from dsv4_operator.cluster.binaries import cache_dir
from dsv4_operator.cluster.local import LocalCluster
from dsv4_operator.demo import HICACHE_BF16, local_world, patch_features, rollout_of, wait


def operator_writes(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/debug/requests", timeout=5) as r:
        return int(json.loads(r.read())["writes"])


def one_rollout(cluster: LocalCluster, port: int, fault: bool) -> dict[str, Any]:
    before = rollout_of(cluster).get("canaryRevision")
    writes = operator_writes(port)
    started = time.monotonic()
    patch_features(cluster, {**HICACHE_BF16, "faultInjection": {"ungatedIndexK": fault}})

    def verdict() -> dict[str, Any] | None:
        rollout = rollout_of(cluster)
        fresh = rollout.get("canaryRevision") != before
        return rollout if fresh and rollout.get("verdict") else None

    judged = wait("a verdict", verdict)
    verdict_s = time.monotonic() - started
    done = wait(
        "the rollout to end", lambda: rollout_of(cluster).get("phase") in ("Idle", "RolledBack")
    )
    return {
        "verdict": judged["verdict"],
        "verdict_s": verdict_s,
        "done_s": time.monotonic() - started,
        "samples": judged.get("samples"),
        "phase": rollout_of(cluster)["phase"] if done else None,
        "writes": operator_writes(port) - writes,
    }


def main() -> None:
    out_dir = cache_dir() / "bench-rollout"
    with local_world(out_dir, cluster_name="bench-rollout") as (cluster, port):
        time.sleep(10)  # let the first reconciles settle before counting
        failed = one_rollout(cluster, port, fault=True)
        passed = one_rollout(cluster, port, fault=False)
    print("\nRollout on the shipped defaults (HiCache + bf16 index-K; CPU reference engine)")
    print(f"  {'':<36} {'index-K race injected':>22} {'gated':>12}")
    rows = [
        ("verdict", "verdict", "{}"),
        ("flag change -> verdict (s)", "verdict_s", "{:.0f}"),
        ("flag change -> rollout done (s)", "done_s", "{:.0f}"),
        ("judged samples", "samples", "{}"),
        ("ends in", "phase", "{}"),
        ("API writes by the operator", "writes", "{}"),
    ]
    for label, key, fmt in rows:
        print(f"  {label:<36} {fmt.format(failed[key]):>22} {fmt.format(passed[key]):>12}")


if __name__ == "__main__":
    main()
