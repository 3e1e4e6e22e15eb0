"""Feature-flag rollouts end to end, on the shipped defaults: real control plane, real operator
process, the local runtime running the CPU reference engine for every engine pod, real probes
as a cluster runs them — a Job per attempt, whose pod the local runtime runs
(`dsv4ctl probe` as the probe's ServiceAccount) and whose exit the Job controller reads.

The shipped reference-engine sample (manifests/samples/flash-reference.yaml) is applied
unchanged and lives through the module in order, as a platform team's would: a replicas-only
change (no canary), HiCache turned on (PASS → surged in pairs under user load), a corrupting
flag change (FAIL → rolled back, sticky), a canary that never
answers (INCONCLUSIVE → rolled back), and a clean change whose probing is interrupted by an
operator restart (the probe Job runs on; the restarted operator waits for it, PASS →
promoted once), then the promoted deployment watched and a router pod deleted under it.  Every canary runs the default
`spec.canary` — 598 clean samples at most 0.5% corruption, 95% confidence — except where a
test says which timeout it shortens and why.
"""

from __future__ import annotations

import ipaddress
import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from dsv4_dev.cluster import pod_network
from dsv4_dev.cluster.local import LocalCluster
from dsv4_dev.localrun import readiness
from dsv4_engine.engine_config import Backend
from dsv4_engine.probe.verdict import exercised_needed
from dsv4_operator.api.rollout import CanarySpec
from dsv4_operator.api.samples import shipped_sample
from dsv4_operator.render.engine import ENGINE_PORT
from dsv4_operator.render.router import ROUTER_DRAIN_S
from dsv4_operator.rollout import manual
from dsv4_operator.rollout.decide import ManualAction
from tests.e2e.helpers import (
    EngineCounterWatch,
    RouterLoad,
    ServingPairs,
    audit_events,
    get_json,
    serving_reference_sample,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NS = "rollout-e2e"
NAME = "flash"
HICACHE = {"hicache": {"enabled": True, "ratio": 2.0}}
HICACHE_BF16 = {**HICACHE, "indexDtype": "bf16"}
VERDICT_TIMEOUT = 900  # spec.canary.probeTimeoutSeconds, the default
CANARY_DECODE = f"{NAME}--canary-decode"
# Seconds from a flag change to its promotion, by the test that measured it: what an undo
# is compared with.
TIMES: dict[str, float] = {}


@pytest.fixture(scope="module")
def world(cluster: LocalCluster, tmp_path_factory):
    logs = tmp_path_factory.mktemp("rollout")
    assert "canary" not in shipped_sample("flash-reference")["spec"], "the default canary"
    with serving_reference_sample(cluster, NS, logs) as (operator, runtime):
        yield cluster, operator, runtime, logs


def status(cluster: LocalCluster) -> dict:
    return get_json(cluster, "dsv4", NAME, "-n", NS).get("status") or {}


def rollout(cluster: LocalCluster) -> dict:
    return status(cluster).get("rollout") or {}


def patch_spec(cluster: LocalCluster, spec: dict) -> None:
    cluster.kubectl(
        "patch", "dsv4", NAME, "-n", NS, "--type=merge", "-p", json.dumps({"spec": spec})
    )


def stable_hashes(cluster: LocalCluster) -> dict[str, str]:
    """Each role's engine config hash, in the slot the stable flags run in."""
    key = "inference.dsv4.dev/engine-config-hash"
    suffix = "" if rollout(cluster).get("slot", "blue") == "blue" else "-green"
    return {
        role: get_json(cluster, "statefulset", f"{NAME}-{role}{suffix}", "-n", NS)["spec"][
            "template"
        ]["metadata"]["annotations"][key]
        for role in ("prefill", "decode")
    }


def canary_exists(cluster: LocalCluster) -> bool:
    result = cluster.kubectl("get", "statefulset", CANARY_DECODE, "-n", NS, check=False)
    return result.returncode == 0


def runtime_pod_url(cluster: LocalCluster, url: str) -> bool:
    """Whether ``url`` is an engine's, at a pod IP the cluster's local runtime hands out."""
    namespace, name = pod_network.PUBLISHED
    published = get_json(cluster, "configmap", name, "-n", namespace)["data"]
    found = re.fullmatch(rf"http://([\d.]+):{ENGINE_PORT}", url)
    network = ipaddress.ip_network(published[pod_network.RANGE_KEY])
    return found is not None and ipaddress.ip_address(found[1]) in network


def events(cluster: LocalCluster, reason: str) -> list[dict]:
    items = get_json(cluster, "events", "-n", NS)["items"]
    return [e for e in items if e["reason"] == reason]


def dsv4ctl(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess:
    command = [str(Path(sys.executable).with_name("dsv4ctl")), *args, "-n", NS]
    return subprocess.run(command, capture_output=True, text=True, env=cluster.env, timeout=60)


def report_timing(label: str, seconds: float) -> None:
    """Times to each verdict on this machine, shown with `pytest -s` (and by bench-rollout)."""
    print(f"\n[rollout e2e] {label}: {seconds:.0f} s")


def test_replicas_only_change_needs_no_canary(world):
    cluster, *_ = world
    before = rollout(cluster)
    patch_spec(cluster, {"decode": {"replicas": 2}})
    wait_for(
        "two decode replicas",
        lambda: (
            get_json(cluster, "statefulset", f"{NAME}-decode", "-n", NS)
            .get("status", {})
            .get("readyReplicas")
            == 2
        ),
        120,
    )
    after = rollout(cluster)
    assert after["phase"] == "Idle"
    assert after["stableRevision"] == before["stableRevision"]
    assert not canary_exists(cluster)
    patch_spec(cluster, {"decode": {"replicas": 1}})


def promoted_or_rejected(cluster: LocalCluster, before: dict) -> dict:
    """The rollout of the flags asked for after ``before``, once promoted or rolled back."""
    return wait_for(
        "the verdict and its promotion",
        lambda: (
            (r := rollout(cluster)).get("canaryRevision") != before.get("canaryRevision")
            and (
                r.get("phase") == "RolledBack"
                or (r.get("phase") == "Idle" and r.get("stableRevision") == r["canaryRevision"])
            )
            and r
        ),
        VERDICT_TIMEOUT,
    )


def test_hicache_on_is_surged_with_no_failed_request_and_a_pair_always_serving(world):
    """The change this project exists to ship, HiCache on with index-K fp8 kept, keeps the
    prefill→decode transfer format.  The sample runs one prefill and one decode: rolled in
    place, each role would serve nothing while its new pod loaded.  By default the PASS is
    promoted as a surge instead — the new pair serves in the other slot before the old
    one's router and engines go — so eight sessions through the router Service never get a
    failed answer, and the Ready pods sampled throughout always hold a serving pair."""
    cluster, *_ = world
    before = rollout(cluster)
    load = RouterLoad(cluster, NS, f"{NAME}-router", sessions=8)
    load.start()
    serving = ServingPairs(cluster, NS, NAME)
    serving.start()
    started = time.monotonic()
    patch_spec(cluster, {"features": HICACHE})
    done = promoted_or_rejected(cluster, before)
    TIMES["canary"] = time.monotonic() - started
    report_timing("HiCache on -> PASS -> surged (default canary)", TIMES["canary"])
    load.stop()
    serving.stop()
    assert done["verdict"] == "PASS", done.get("verdictReason")
    assert done["transfer"] == "compatible" and done["promotion"] == "Surge"
    assert done["slot"] != before.get("slot", "blue"), "the new pair grew in the other slot"
    assert load.ok > 0 and not load.failed and not load.corrupt, (load.failed[:5], load.corrupt)
    print(
        f"\n[rollout e2e] surge: {load.ok} answers, 0 failed; {len(serving.samples)} samples "
        f"of Ready pods, fewest serving pairs {serving.fewest}, most {max(serving.samples)}"
    )
    assert len(serving.samples) > 20 and serving.fewest >= 1, serving.samples


def test_corrupting_flags_fail_the_default_canary_and_are_rolled_back_sticky(world):
    cluster, *_ = world
    hashes = stable_hashes(cluster)
    stable = rollout(cluster)["stableRevision"]
    started = time.monotonic()
    patch_spec(cluster, {"features": {**HICACHE_BF16, "faultInjection": {"ungatedIndexK": True}}})
    done = wait_for(
        "canary verdict",
        lambda: (r := rollout(cluster)).get("phase") == "RolledBack" and r,
        VERDICT_TIMEOUT,
    )
    report_timing("flag change -> FAIL (default canary)", time.monotonic() - started)
    assert done["verdict"] == "FAIL", done
    # The race's rate follows the machine's load (copy vs compute timing); what the verdict
    # needs is a rate above the default budget, proven at the default confidence.
    assert done["rate"] > CanarySpec().max_corruption_rate
    assert done["rejectedRevision"] == done["canaryRevision"]
    report = json.loads(
        get_json(cluster, "configmap", done["report"], "-n", NS)["data"]["report.json"]
    )
    assert report["verdict"] == "FAIL"
    # The canary's engines ran kv-canary in log mode (as every canary does): they caught the
    # stale index-K reads themselves, and the report names them.
    assert report["settings"]["kv_canary"] is True and report["kv_canary"]["unread"] is None
    caught = report["kv_canary"]["violations"]
    assert {v["launch_tag"] for v in caught} == {"INDEX_K_READ"}, caught
    # ... read through sglang-router's /engine_metrics: each named by an engine pod's IP (one
    # the local runtime handed out) and port.
    assert all(runtime_pod_url(cluster, v["worker"]) for v in caught), caught
    assert any(r.startswith("kv-canary violations during the run: ") for r in report["reasons"])
    wait_for("canary deleted", lambda: not canary_exists(cluster), 60)
    assert stable_hashes(cluster) == hashes, "production never ran the rejected flags"
    assert rollout(cluster)["stableRevision"] == stable
    # Sticky: the spec still asks for the rejected flags, and nothing is retried.
    for _ in range(5):
        assert rollout(cluster)["phase"] == "RolledBack"
        assert not canary_exists(cluster)
        subprocess.run(["sleep", "2"], check=True)


def test_a_canary_that_never_answers_is_inconclusive_and_rolled_back(world):
    """Waiting out the default ready timeout (15 minutes) is not a test: this one shortens it,
    the only setting changed; the rule it checks is the timeout's, whatever its length."""
    cluster, _, runtime, _ = world
    runtime.stop()  # nothing plays kubelet: the canary's endpoint never comes up
    try:
        patch_spec(
            cluster,
            {
                "features": {**HICACHE_BF16, "faultInjection": {"ungatedIndexK": False}},
                "canary": {"readyTimeoutSeconds": 15},
            },
        )
        done = wait_for(
            "INCONCLUSIVE verdict",
            lambda: (
                (r := rollout(cluster)).get("phase") == "RolledBack"
                and r.get("canaryRevision") != r.get("stableRevision")
                and r.get("verdict") == "INCONCLUSIVE"
                and r
            ),
            120,
        )
        assert done["rejectedRevision"] == done["canaryRevision"]
        # Events follow the status write that records the decision: wait for it.
        wait_for(
            "the RolledBack Event",
            lambda: any(
                e["message"].startswith("INCONCLUSIVE: canary not Ready within 15s")
                for e in events(cluster, "RolledBack")
            ),
            30,
        )
    finally:
        patch_spec(cluster, {"canary": None})  # back to the defaults
        runtime.start()


def test_clean_flags_pass_the_default_canary_and_promote_once_across_an_operator_restart(world):
    """bf16 index-K is another prefill→decode transfer format than the stable fp8: after the
    PASS it is promoted in pairs, under continuous load from eight sessions that must never
    get a failed or garbled answer (a prefill and a decode of different formats paired)."""
    cluster, operator, _, _ = world
    hashes = stable_hashes(cluster)
    audit_start = cluster.audit_log.stat().st_size
    started = time.monotonic()
    retried = dsv4ctl(cluster, "rollout", "retry", NAME, "--kubeconfig", cluster.kubeconfig)
    assert retried.returncode == 0, retried.stderr
    probing = wait_for(
        "probing", lambda: (r := rollout(cluster)).get("phase") == "Probing" and r, 300
    )
    assert probing["transfer"] == "incompatible"
    load = RouterLoad(cluster, NS, f"{NAME}-router", sessions=8)
    load.start()
    serving = ServingPairs(cluster, NS, NAME)
    serving.start()
    mismatches = EngineCounterWatch(cluster, NS, "dsv4:pd_transfer_format_mismatch_total")
    mismatches.start()
    operator.stop(signal.SIGKILL)  # mid-probe, no goodbye
    operator.start()
    wait_for(
        "the restarted operator to lead",
        lambda: operator.text().count("operator starting") == 2,
        60,
    )
    done = wait_for(
        "promotion",
        lambda: (
            (r := rollout(cluster)).get("phase") == "Idle"
            and r.get("stableRevision") == probing["canaryRevision"]
            and r
        ),
        VERDICT_TIMEOUT,
    )
    report_timing(
        "retry -> PASS -> promoted (default canary, one restart)", time.monotonic() - started
    )
    load.stop()
    serving.stop()
    mismatches.stop()
    assert done["verdict"] == "PASS" and done["samples"] >= 598
    assert len(serving.samples) > 20 and serving.fewest >= 1, serving.samples
    # HiCache is on: the PASS rests on answers proven to have read their prefix back from
    # the host tier, by eviction from the canary's capped device pool (no offload call, the
    # default), counted by the engines themselves and read through sglang-router.
    filed = json.loads(
        get_json(cluster, "configmap", done["report"], "-n", NS)["data"]["report.json"]
    )
    assert filed["settings"]["hicache"] is True and filed["settings"]["admin_offload_path"] is None
    assert filed["samples"]["exercised"] >= exercised_needed(filed["confidence"]), filed["samples"]
    host = filed["host_tier"]
    assert host["unread"] is None and host["host_tokens"] > 0, host
    print(
        f"\n[rollout e2e] host tier: {host['host_tokens']} prompt tokens read back, "
        f"{filed['samples']['exercised']} of {filed['samples']['judged']} judged answers proven"
    )
    assert host["device_pool_tokens"] == CanarySpec().pool_tokens(Backend.REFERENCE), host
    # Users saw nothing of it: every answer came, none garbled, no engine paired formats.
    assert load.ok > 0 and not load.failed and not load.corrupt, (load.failed[:5], load.corrupt)
    scraped = mismatches.highest
    assert any(re.fullmatch(rf"{NAME}-decode-\d+", pod) for pod in scraped), scraped  # blue
    assert any(re.fullmatch(rf"{NAME}-decode-green-\d+", pod) for pod in scraped), scraped
    assert not any(scraped.values()), scraped
    # The restart resumed the same rollout: the same attempt, one canary slice created.
    assert done["probeAttempt"] == probing["probeAttempt"]
    created = [
        e
        for e in audit_events(cluster, audit_start)
        if e.get("verb") in ("create", "patch")
        and e.get("objectRef", {}).get("resource") == "statefulsets"
        and e.get("objectRef", {}).get("name") == CANARY_DECODE
        and e.get("responseStatus", {}).get("code") == 201
    ]
    assert len(created) == 1, created
    assert stable_hashes(cluster) != hashes

    def promoted_events() -> list[dict]:
        revision = f"revision {probing['canaryRevision']}:"
        return [e for e in events(cluster, "Promoted") if revision in e["message"]]

    wait_for("the Promoted Event", promoted_events, 30)
    assert len(promoted_events()) == 1
    wait_for("canary deleted after promotion", lambda: not canary_exists(cluster), 120)
    # The retry acted once, across the restart, and stays where dsv4ctl wrote it (the
    # operator writes the status only): its token is the handled one.
    obj = get_json(cluster, "dsv4", NAME, "-n", NS)
    control = manual.parse(obj["metadata"].get("annotations"))
    assert control is not None and control.action is ManualAction.RETRY
    assert obj["status"]["rollout"]["handledAction"] == control.token
    assert len(events(cluster, "RetryRequested")) == 1, "the retry acted once"


def test_the_promoted_deployment_is_watched_and_a_watch_is_no_proof(world):
    cluster, *_ = world
    patch_spec(cluster, {"rollout": {"stableProbeIntervalSeconds": 5}})
    # KWOK marks the promoted pods Ready at once, while the local runtime needs a few seconds
    # to swap their engine processes; a run in that window meets a dying engine and finds
    # no evidence (never corruption).  The next ones, 5 s apart, see clean answers.
    done = wait_for(
        "a watch run that judged samples",
        lambda: (
            (w := rollout(cluster).get("stableProbe") or {}).get("verdict")
            in ("NoCorruptionSeen", "Corrupt")
            and w
        ),
        VERDICT_TIMEOUT,
    )
    assert done["verdict"] == "NoCorruptionSeen" and done["samples"] > 0
    assert status(cluster)["phase"] == "Ready"  # a clean production watch changes nothing
    patch_spec(cluster, {"rollout": {"stableProbeIntervalSeconds": 0}})


def test_a_deleted_router_pod_stays_until_its_process_has_drained_and_stopped(world):
    """kubelet removes a pod only once its containers have stopped, and the router's preStop
    sleep keeps it answering meanwhile: a router pod deleted is marked terminating, its
    process still answers through the sleep, and the pod is gone only after the process
    stopped.  That is what lets a paired promotion's Retire (foreground deletion of the old
    slot's routers) remove the old engines only once no router routes to them.  The local
    runtime restarts first, as a kubelet may: a pod it adopts is held as a new one is (one
    let go by the runtime before it was not: CI's 503 after a test had restarted it)."""
    cluster, _, runtime, _ = world
    runtime.stop()
    runtime.start()

    def adopted() -> dict | None:
        """A router pod the restarted runtime runs: held, and answering."""
        pods = get_json(cluster, "pods", "-n", NS, "-l", "app.kubernetes.io/component=router")
        return next(
            (
                p
                for p in pods["items"]
                if not p["metadata"].get("deletionTimestamp")
                and readiness.HOLD in (p["metadata"].get("finalizers") or [])
                and answers(f"http://{p['status']['podIP']}:8000/health")
            ),
            None,
        )

    pod = wait_for("the restarted runtime to run a router", adopted, 120)
    name, url = pod["metadata"]["name"], f"http://{pod['status']['podIP']}:8000/health"
    deleted = time.monotonic()
    cluster.kubectl("delete", "pod", name, "-n", NS, "--wait=false")
    answered: list[bool] = []

    def gone() -> bool:
        exists = cluster.kubectl("get", "pod", name, "-n", NS, check=False).returncode == 0
        if exists:
            answered.append(answers(url))
        return not exists

    wait_for("the deleted router pod to go", gone, 60)
    assert time.monotonic() - deleted >= ROUTER_DRAIN_S
    assert answered and answered[0], "the router answered while its pod was terminating"
    assert not answers(url), "the pod went before its process stopped"
    wait_for("its replacement to be Ready", lambda: ready_router(cluster, name), 60)


def test_undo_returns_to_the_flags_before_faster_than_a_canary_with_no_failed_request(world):
    """After HiCache on (fp8) was promoted, then bf16 index-K: `dsv4ctl rollout undo` returns
    production to HiCache on with fp8, the newest revision that served and was not
    rejected, through the same surge promotion and without a canary: faster than the canary
    and promotion of that same revision took, with no failed request and a serving pair at
    every sample; the bf16 flags left behind are rejected.  An undo to flags a canary
    rejected is refused before anything is written."""
    cluster, *_ = world
    before = rollout(cluster)
    history = before["history"]
    assert [h.get("verdict") for h in history] == ["PASS", "PASS", None], history
    ledger = get_json(cluster, "configmap", f"{NAME}-revisions", "-n", NS)["data"]
    (corrupting,) = json.loads(ledger["rejected.json"])  # the ungated flags' FAIL
    generation = get_json(cluster, "dsv4", NAME, "-n", NS)["metadata"]["generation"]
    refused = dsv4ctl(cluster, "rollout", "undo", NAME, "--to-revision", corrupting)
    assert refused.returncode == 1 and f"flags {corrupting} never served here" in refused.stderr
    printed = dsv4ctl(cluster, "rollout", "undo", NAME, "--print-patch")
    assert printed.returncode == 0, printed.stderr
    assert json.loads(printed.stdout)["spec"]["features"]["indexDtype"] == "fp8"
    assert get_json(cluster, "dsv4", NAME, "-n", NS)["metadata"]["generation"] == generation
    target = history[1]["flags"]
    load = RouterLoad(cluster, NS, f"{NAME}-router", sessions=8)
    load.start()
    serving = ServingPairs(cluster, NS, NAME)
    serving.start()
    started = time.monotonic()
    asked = dsv4ctl(cluster, "rollout", "undo", NAME)
    assert asked.returncode == 0, asked.stderr
    done = wait_for(
        "the undo",
        lambda: (
            (r := rollout(cluster)).get("phase") == "Idle"
            and r.get("verdict") == "UNDO"
            and r.get("stableRevision") != before["stableRevision"]
            and r
        ),
        VERDICT_TIMEOUT,
    )
    took = time.monotonic() - started
    load.stop()
    serving.stop()
    print(
        f"\n[rollout e2e] undo: {took:.0f} s (the canary and promotion of the same flags: "
        f"{TIMES['canary']:.0f} s); {load.ok} answers, {len(load.failed)} failed"
    )
    assert done["stable"]["spec"] == target["spec"] and done["stable"] == target
    assert done["rejectedRevision"] == before["stableRevision"]
    assert took < TIMES["canary"], (took, TIMES)
    assert load.ok > 0 and not load.failed and not load.corrupt, (load.failed[:5], load.corrupt)
    assert len(serving.samples) > 10 and serving.fewest >= 1, serving.samples
    assert [h.get("verdict") for h in done["history"]] == ["UNDO", "PASS", None]
    again = dsv4ctl(cluster, "rollout", "undo", NAME, "--to-revision", before["stableRevision"])
    assert again.returncode == 1 and "were rejected" in again.stderr, again.stderr


def ready_router(cluster: LocalCluster, other_than: str) -> bool:
    pods = get_json(cluster, "pods", "-n", NS, "-l", "app.kubernetes.io/component=router")
    return any(
        p["metadata"]["name"] != other_than
        and any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in p["status"].get("conditions") or []
        )
        for p in pods["items"]
    )


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False
