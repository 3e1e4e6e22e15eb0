"""Rollout benchmark: time from a feature-flag change to the canary's verdict and to the end
of promotion, and how many API writes one rollout makes (the operator's own counter).

Runs on the local world of `make demo` (real control plane, operator, local runtime with
the CPU reference engine), with the demo's canary size.  Prints one table.
"""

from __future__ import annotations

import json
import time
import urllib.request

from dsv4_operator.cluster.binaries import cache_dir
from dsv4_operator.demo import HICACHE_BF16, local_world, patch_features, rollout_of, wait


def operator_writes(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/debug/requests", timeout=5) as r:
        return int(json.loads(r.read())["writes"])


def main() -> None:
    out_dir = cache_dir() / "bench-rollout"
    with local_world(out_dir, cluster_name="bench-rollout") as (cluster, port):
        time.sleep(10)  # let the first reconciles settle before counting
        writes_before = operator_writes(port)
        started = time.monotonic()
        patch_features(cluster, {**HICACHE_BF16, "faultInjection": {"ungatedIndexK": False}})
        wait("a verdict", lambda: rollout_of(cluster).get("verdict") is not None)
        verdict_s = time.monotonic() - started
        verdict = rollout_of(cluster)["verdict"]
        wait(
            "the rollout to end", lambda: rollout_of(cluster).get("phase") in ("Idle", "RolledBack")
        )
        done_s = time.monotonic() - started
        rollout = rollout_of(cluster)
        writes = operator_writes(port) - writes_before
    rows = [
        ("verdict", verdict),
        ("flag change -> verdict", f"{verdict_s:.0f} s"),
        ("flag change -> promotion done", f"{done_s:.0f} s"),
        ("probe samples", rollout.get("samples")),
        ("API writes by the operator for this rollout", writes),
    ]
    print("\nRollout (HiCache + bf16 index-K, gated; CPU reference engine, demo canary size)")
    for label, value in rows:
        print(f"  {label:<45} {value}")


if __name__ == "__main__":
    main()
