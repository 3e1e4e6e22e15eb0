"""Rollout benchmark: on the shipped reference-engine sample with the production canary
defaults (598 clean samples, 0.5% at 95%), the time from a flag change to each verdict and
to the end of the rollout, the samples judged, and the API writes one rollout makes (the
operator's own counter).

Runs on the local world of `make demo` (real control plane, operator, local runtime with the
CPU reference engine), with the operator's default probe mode: each attempt is a probe Job
whose pod the local runtime runs, so the times include the Job's creation, its pod's start
and the Job controller marking it complete: first the incident's flags with the index-K race injected (FAIL →
rolled back), then the same flags gated (PASS → promoted: bf16 index-K is another
prefill→decode transfer format than the stable fp8), then a change that keeps the format
(HiCache off again: PASS → promoted), then `dsv4ctl rollout undo` back to the gated flags
(no canary).  Every promotion goes in pairs (a surge, the default): the table shows how long
each takes and the most GPUs it asked for beyond the stable slot's.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from dsv4_dev.cluster.binaries import cache_dir
from dsv4_dev.cluster.local import LocalCluster
from dsv4_dev.demo import (
    HICACHE_BF16,
    NAME,
    NAMESPACE,
    local_world,
    patch_features,
    rollout_of,
    wait,
)
from dsv4_operator.cli.main import main as dsv4ctl


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


def one_rollout(cluster: LocalCluster, port: int, change: Callable[[], None]) -> dict[str, Any]:
    """From ``change`` (a flag change, an undo) to its verdict and to the rollout's end."""
    before = rollout_of(cluster).get("canaryRevision")
    writes = operator_writes(port)
    baseline = stable_gpus(cluster)
    started = time.monotonic()
    change()

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
        "promotion": judged.get("promotion") or "-",
        "verdict_s": verdict_s,
        "done_s": done_s,
        "promotion_s": done_s - verdict_s,
        "peak_extra_gpus": peak - baseline,
        "samples": judged.get("samples", "-"),  # an undo runs no probe
        "phase": phase,
        "writes": operator_writes(port) - writes,
    }


def main() -> None:
    out_dir = cache_dir() / "bench-rollout"
    with local_world(out_dir, cluster_name="bench-rollout") as (cluster, port):
        time.sleep(10)  # let the first reconciles settle before counting

        def incident(fault: bool) -> Callable[[], None]:
            features = {**HICACHE_BF16, "faultInjection": {"ungatedIndexK": fault}}
            return lambda: patch_features(cluster, features)

        def undo() -> None:
            asked = ["rollout", "undo", NAME, "-n", NAMESPACE, "--kubeconfig", cluster.kubeconfig]
            if dsv4ctl(asked) != 0:
                raise SystemExit("dsv4ctl rollout undo failed")

        runs = {
            "index-K race injected": one_rollout(cluster, port, incident(fault=True)),
            "gated": one_rollout(cluster, port, incident(fault=False)),
            "HiCache off": one_rollout(
                cluster, port, lambda: patch_features(cluster, {"hicache": {"enabled": False}})
            ),
            "undo (to gated)": one_rollout(cluster, port, undo),
        }
    print(
        "\nRollout on the shipped defaults (HiCache + bf16 index-K; CPU reference engine; "
        "probes as Jobs; promotion in pairs, the default)"
    )
    print(f"  {'':<36}" + "".join(f" {name:>22}" for name in runs))
    rows = [
        ("verdict", "verdict", "{}"),
        ("transfer format vs stable", "transfer", "{}"),
        ("promoted as", "promotion", "{}"),
        ("change -> verdict (s)", "verdict_s", "{:.0f}"),
        ("change -> rollout done (s)", "done_s", "{:.0f}"),
        ("promotion (s)", "promotion_s", "{:.0f}"),
        ("peak extra GPUs while promoting", "peak_extra_gpus", "{}"),
        ("judged samples", "samples", "{}"),
        ("ends in", "phase", "{}"),
        ("API writes by the operator", "writes", "{}"),
    ]
    for label, key, fmt in rows:
        print(f"  {label:<36}" + "".join(f" {fmt.format(r[key]):>22}" for r in runs.values()))


if __name__ == "__main__":
    main()
