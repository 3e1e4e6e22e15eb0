"""Rollout benchmark: on the shipped reference-engine sample with the production canary
defaults (598 clean samples, 0.5% at 95%), the time from a flag change to each verdict and
to the end of the rollout, the samples judged, and the API writes one rollout makes (the
operator's own counter).

Runs on the local world of `make demo` (real control plane, operator, local runtime with the
CPU reference engine), with the operator's default probe mode: each attempt is a probe Job
whose pod the local runtime runs, so the times include the Job's creation, its pod's start
and the Job controller marking it complete: first the incident's flags with the index-K race injected (FAIL →
rolled back), then the same flags gated (PASS → promoted).  bf16 index-K is another
prefill→decode transfer format than the stable fp8, so that promotion goes in pairs: the
table shows how long it takes and the most GPUs it asked for beyond the stable slot's.
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

from dsv4_dev.cluster.binaries import cache_dir
from dsv4_dev.cluster.local import LocalCluster
from dsv4_dev.demo import (
    HICACHE_BF16,
    NAMESPACE,
    local_world,
    patch_features,
    rollout_of,
    wait,
)


def operator_writes(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/debug/requests", timeout=5) as r:
        return int(json.loads(r.read())["writes"])


def stable_gpus(cluster: LocalCluster) -> int:
    """GPUs the stable engines ask for now: every slot's StatefulSets (not the canary)."""
    listed = cluster.kubectl(
        "get", "statefulsets", "-n", NAMESPACE, "-l", "app.kubernetes.io/instance=flash",
        "-o", "json",
    )  # fmt: skip
    total = 0
    for sts in json.loads(listed.stdout)["items"]:
        (container,) = sts["spec"]["template"]["spec"]["containers"]
        per_pod = int(container["resources"]["limits"].get("nvidia.com/gpu", 0))
        total += per_pod * sts["spec"]["replicas"]
    return total


def one_rollout(cluster: LocalCluster, port: int, fault: bool) -> dict[str, Any]:
    before = rollout_of(cluster).get("canaryRevision")
    writes = operator_writes(port)
    baseline = stable_gpus(cluster)
    started = time.monotonic()
    patch_features(cluster, {**HICACHE_BF16, "faultInjection": {"ungatedIndexK": fault}})

    def verdict() -> dict[str, Any] | None:
        rollout = rollout_of(cluster)
        fresh = rollout.get("canaryRevision") != before
        return rollout if fresh and rollout.get("verdict") else None

    judged = wait("a verdict", verdict)
    verdict_s = time.monotonic() - started
    peak = baseline
    while (phase := rollout_of(cluster).get("phase")) not in ("Idle", "RolledBack"):
        peak = max(peak, stable_gpus(cluster))  # the promotion's extra engines, sampled
        time.sleep(0.5)
    done_s = time.monotonic() - started
    return {
        "verdict": judged["verdict"],
        "transfer": judged.get("transfer"),
        "verdict_s": verdict_s,
        "done_s": done_s,
        "promotion_s": done_s - verdict_s,
        "peak_extra_gpus": peak - baseline,
        "samples": judged.get("samples"),
        "phase": phase,
        "writes": operator_writes(port) - writes,
    }


def main() -> None:
    out_dir = cache_dir() / "bench-rollout"
    with local_world(out_dir, cluster_name="bench-rollout") as (cluster, port):
        time.sleep(10)  # let the first reconciles settle before counting
        failed = one_rollout(cluster, port, fault=True)
        passed = one_rollout(cluster, port, fault=False)
    print(
        "\nRollout on the shipped defaults (HiCache + bf16 index-K; CPU reference engine; "
        "probes as Jobs)"
    )
    print(f"  {'':<36} {'index-K race injected':>22} {'gated':>12}")
    rows = [
        ("verdict", "verdict", "{}"),
        ("transfer format vs stable", "transfer", "{}"),
        ("flag change -> verdict (s)", "verdict_s", "{:.0f}"),
        ("flag change -> rollout done (s)", "done_s", "{:.0f}"),
        ("promotion (paired) (s)", "promotion_s", "{:.0f}"),
        ("peak extra GPUs while promoting", "peak_extra_gpus", "{}"),
        ("judged samples", "samples", "{}"),
        ("ends in", "phase", "{}"),
        ("API writes by the operator", "writes", "{}"),
    ]
    for label, key, fmt in rows:
        print(f"  {label:<36} {fmt.format(failed[key]):>22} {fmt.format(passed[key]):>12}")


if __name__ == "__main__":
    main()
