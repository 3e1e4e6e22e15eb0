"""`make demo`: the incident's story on the production defaults, start to finish.

Brings up the local control plane (fake B200 nodes), the operator (which probes canaries
with Jobs, as in a cluster) and the local runtime (which runs the CPU reference engine for
every engine pod, and each probe Job's `dsv4ctl probe`), applies
manifests/samples/flash-echo.yaml unchanged — the echo model, whose tool calls go through
the engine's real indexer and pools, and the production canary defaults (598 clean
samples at most 0.5% corruption with 95% confidence) — then changes its engine flags twice:

1. HiCache + bf16 index-K **with the index-K gate fault injected** (`faultInjection`, a
   reference-engine-only flag that re-creates the seed incident) into a share of the
   host-tier loads aimed at the incident's 12-18% of garbled calls: the canary's tool-call
   probes FAIL, the report shows the garbled calls beside the calls asked for, the rollout
   is rolled back, production never sees the flags.
2. The same flags without the fault: the canary PASSes and the flags are promoted.

Each verdict's probe Job is shown as the Job controller ended it (Failed on the FAIL's exit
1, Complete on the PASS).  Both reports are printed and saved as JSON and as HTML pages.  Everything started is
stopped at the end or on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dsv4_dev.cluster.binaries import MissingBinaryError, cache_dir
from dsv4_dev.cluster.local import ClusterError, LocalCluster
from dsv4_dev.localrun.runtime import READY, free_port
from dsv4_engine.probe.html_report import render_html
from dsv4_operator.api import CRD_NAME
from dsv4_operator.api.crd import CRD_PATH
from dsv4_operator.api.rollout import Promotion, Transfer
from dsv4_operator.api.samples import shipped_sample
from dsv4_operator.rollout.probe_job import job_name, job_state

NAMESPACE = "demo"
NAME = "flash"
HICACHE_BF16 = {"hicache": {"enabled": True, "ratio": 2.0}, "indexDtype": "bf16"}
STEP_TIMEOUT_S = 900.0


SAMPLE = "flash-echo"  # a shipped sample, applied unchanged
# faultInjection.ungatedShare: every host-tier load races its indexer.  The canary reaches
# the host tier by eviction from its capped pool, so those loads are a share of its answers':
# 10 of 87 tool calls came back garbled before the FAIL rule fired (11.5%; the incident saw
# 12-18%; docs/rollout.md).
UNGATED_SHARE = 1.0


def say(message: str) -> None:
    print(f"demo: {message}", flush=True)


@contextlib.contextmanager
def background(
    command: list[str], log_path: Path, env: dict[str, str], ready: str | None = None
) -> Iterator[None]:
    """``command`` running, logging to ``log_path``; with ``ready``, once it logged that."""
    with log_path.open("w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        if ready is not None:
            wait(f"{ready!r} in {log_path}", lambda: _logged(proc, log_path, ready))
        yield
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _logged(proc: subprocess.Popen, log_path: Path, line: str) -> bool:
    if proc.poll() is not None:
        raise ClusterError(f"{proc.args} exited: {log_path.read_text()[-2000:]}")
    return line in log_path.read_text()


def wait(what: str, probe: Callable[[], Any], timeout: float = STEP_TIMEOUT_S) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.5)
    raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}")


def rollout_of(cluster: LocalCluster) -> dict[str, Any]:
    obj = json.loads(cluster.kubectl("get", "dsv4", NAME, "-n", NAMESPACE, "-o", "json").stdout)
    return (obj.get("status") or {}).get("rollout") or {}


def patch_features(cluster: LocalCluster, features: dict[str, Any]) -> None:
    body = json.dumps({"spec": {"features": features}})
    cluster.kubectl("patch", "dsv4", NAME, "-n", NAMESPACE, "--type=merge", "-p", body)


def probe_job(cluster: LocalCluster, report: str) -> str:
    """The attempt's probe Job as the Job controller left it, in words."""
    result = cluster.kubectl(
        "get", "job", job_name(report), "-n", NAMESPACE, "-o", "json", check=False
    )
    job = json.loads(result.stdout) if result.returncode == 0 else None
    state, why = job_state(job)
    return f"probe Job {job_name(report)}: {state.value} ({why})"


def show_report(cluster: LocalCluster, out_dir: Path, label: str) -> None:
    rollout = rollout_of(cluster)
    if "report" in rollout:
        say(probe_job(cluster, rollout["report"]))
    dsv4ctl = [str(Path(sys.executable).with_name("dsv4ctl")), "rollout"]
    common = [NAME, "-n", NAMESPACE, "--kubeconfig", cluster.kubeconfig]
    for args in (["status", *common], ["report", *common]):
        print(subprocess.run([*dsv4ctl, *args], capture_output=True, text=True).stdout)
    report = subprocess.run(
        [*dsv4ctl, "report", *common, "--output", "json"], capture_output=True, text=True
    ).stdout
    path = out_dir / f"{label}-{rollout.get('report', 'report')}.json"
    path.write_text(report)
    say(f"report JSON saved to {path}")
    body = json.loads(report) if report.strip() else {}
    if "samples" in body:  # a probe ran: its page, with each damaged call beside the clean one
        page = path.with_suffix(".html")
        page.write_text(render_html(body))
        say(f"report page saved to {page}")


def apply_sample(cluster: LocalCluster, name: str) -> None:
    sample = shipped_sample(name)
    cluster.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=json.dumps(sample))
    model = sample["spec"]["model"].get("referenceModel", "random")
    say(
        f"applied manifests/samples/{name}.yaml as {NAMESPACE}/{NAME}: 1 prefill + 1 decode on "
        f"B200 nodes, the CPU reference engine ({model} model), the default canary settings"
    )
    wait("the deployment to be Ready", lambda: _phase(cluster) == "Ready")
    print(cluster.kubectl("get", "dsv4", "-n", NAMESPACE).stdout)


def run_story(cluster: LocalCluster, out_dir: Path) -> None:
    say(
        "step 1: HiCache + bf16 index-K WITH the index-K gate fault injected (demo-only flag): "
        f"{UNGATED_SHARE:.0%} of host-tier loads race their indexer, as in the incident"
    )
    fault = {"ungatedIndexK": True, "ungatedShare": UNGATED_SHARE}
    patch_features(cluster, {**HICACHE_BF16, "faultInjection": fault})
    started = time.monotonic()
    wait("the canary verdict", lambda: rollout_of(cluster).get("phase") == "RolledBack")
    say(f"verdict after {time.monotonic() - started:.0f}s: rolled back; production kept its flags")
    show_report(cluster, out_dir, "1-fault-injected")

    say("step 2: the same flags without the fault")
    gated = {"ungatedIndexK": False, "ungatedShare": None}  # null: back to the default
    patch_features(cluster, {**HICACHE_BF16, "faultInjection": gated})
    started = time.monotonic()

    def promoted() -> dict[str, Any] | None:
        rollout = rollout_of(cluster)
        return (
            rollout if rollout.get("phase") == "Idle" and rollout.get("verdict") == "PASS" else None
        )

    done = wait("the canary to pass and the flags to be promoted", promoted)
    say(f"verdict after {time.monotonic() - started:.0f}s: PASS, {how_promoted(done)}")
    show_report(cluster, out_dir, "2-gated")
    print(cluster.kubectl("get", "dsv4", "-n", NAMESPACE).stdout)


def how_promoted(rollout: dict[str, Any]) -> str:
    """How the operator promoted the flags, as its status records it: in prefill+decode pairs
    (a surge, the default, and always for a new prefill→decode transfer format such as bf16
    index-K after fp8), or role by role in place where the spec asked for that."""
    if rollout.get("promotion") == Promotion.IN_PLACE.value:
        return "promoted role by role in place"
    why = (
        "a new prefill→decode transfer format"
        if rollout.get("transfer") == Transfer.INCOMPATIBLE.value
        else "a surge: the old pair served until the new one did"
    )
    return f"promoted in prefill+decode pairs ({why}), now served from slot {rollout.get('slot')}"


def _phase(cluster: LocalCluster) -> str | None:
    result = cluster.kubectl(
        "get", "dsv4", NAME, "-n", NAMESPACE, "-o", "jsonpath={.status.phase}", check=False
    )
    return result.stdout.strip() or None


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def local_world(
    out_dir: Path, cluster_name: str = "demo", sample: str = "flash-reference"
) -> Iterator[tuple[LocalCluster, int]]:
    """The local cluster, the operator (its health port returned) and the local runtime,
    with the shipped sample applied and Ready; everything is stopped on the way out."""
    cluster = LocalCluster(name=cluster_name)
    env = {**cluster.env, "DSV4_LOCALRUN_DIR": str(out_dir / "localrun")}
    (out_dir / "localrun").mkdir(parents=True, exist_ok=True)
    health_port = free_port()
    operator = [
        sys.executable, "-m", "dsv4_dev.operator", "run",
        "--namespace", NAMESPACE, "--lease-namespace", NAMESPACE, "--local-endpoints",
        # The sample's weights are a host path (nothing reads them here): allow just it.
        "--allowed-model-host-paths", shipped_sample("flash-reference")["spec"]["model"]["hostPath"],
        "--resync-seconds", "3", "--health-port", str(health_port),
    ]  # fmt: skip
    runtime = [sys.executable, "-m", "dsv4_dev.localrun.runtime"]
    try:
        cluster.up(log=say)
        cluster.kubectl("create", "namespace", NAMESPACE, check=False)
        # Before the operator: limited to a namespace, it waits for its CRD to be served
        # (checking every few seconds), so with the CRD there first it starts at once.
        cluster.kubectl("apply", "--server-side", "-f", str(CRD_PATH))
        cluster.wait_established(f"crd/{CRD_NAME}")
        with (
            background(operator, out_dir / "operator.log", env),
            background(runtime, out_dir / "localrun.log", env, READY),
        ):
            say(f"operator and local runtime started; logs in {out_dir}")
            apply_sample(cluster, sample)
            yield cluster, health_port
    finally:
        if os.environ.get("DSV4_DEMO_KEEP_CLUSTER") != "1":
            cluster.down(log=say)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsv4_dev.demo", description=__doc__)
    parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` cleans up like Ctrl-C does
    out_dir = cache_dir() / "demo"
    started = time.monotonic()
    try:
        with local_world(out_dir, sample=SAMPLE) as (cluster, _):
            run_story(cluster, out_dir)
    except (ClusterError, MissingBinaryError) as err:
        print(f"demo: error: {err}", file=sys.stderr)
        print(f"demo: logs are in {out_dir}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        say("interrupted; cleaned up")
        return 130
    say(
        f"done in {time.monotonic() - started:.0f}s: both outcomes shown; reports saved "
        f"under {out_dir}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
