"""No silent stuck states, on the real control plane: names at their budget run (canary
included), an engine pod the scheduler cannot place is named in the status with the
scheduler's words and turns Degraded at the progress deadline, and a canary that does not
fit ends NoCapacity within a minute saying why, its flags not rejected.

The operator runs with the default `--resync-seconds` (60): what is shown here must come
from the pod watch and the deadline rechecks, not from a fast resync loop.
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from dsv4_dev.cluster.local import LocalCluster
from dsv4_dev.localrun.runtime import free_port
from dsv4_operator.api.crd import CRD_PATH
from dsv4_operator.api.names import MULTINODE_MAX, SINGLE_NODE_MAX
from dsv4_operator.api.samples import load_sample, merge_patch
from dsv4_operator.cli.main import main
from tests.e2e.helpers import get_json, operator_and_runtime, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NS = "dsv4-stuck"
# One GPU per pod: the name tests' slices and the later tests' all fit the 32 fake GPUs at
# once, so no test waits for another's pods to go.
SINGLE = {role: {"gpusPerNode": 1, "tp": 1} for role in ("prefill", "decode")}
MULTINODE = {
    role: {"nodesPerReplica": 2, "gpusPerNode": 1, "tp": 2} for role in ("prefill", "decode")
}
FP4 = {"features": {"indexDtype": "fp4"}}
# On the 2 TiB fake B200 nodes: decode's pod asks for its 128 GiB plus the HiCache host tier,
# 2.06 TiB at ratio 4 (render.memory.pod_memory), so the canary's decode pod cannot fit.
HICACHE_TOO_BIG = {"features": {"hicache": {"enabled": True, "ratio": 4, "roles": ["decode"]}}}


@pytest.fixture(scope="module")
def ns(cluster: LocalCluster, tmp_path_factory):
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_PATH))
    cluster.wait_established("crd/dsv4deployments.inference.dsv4.dev")
    cluster.kubectl("create", "namespace", NS, check=False)
    port = free_port()
    logs = tmp_path_factory.mktemp("stuck")
    operator, _ = operator_and_runtime(
        cluster, NS, logs, "--resync-seconds", "60", "--health-port", str(port)
    )
    operator.start()
    wait_for("operator ready", lambda: _http(port, "/readyz") is not None, 90)
    try:
        yield cluster, operator, port
    finally:
        operator.stop()
        cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)
    assert "Traceback" not in operator.text()


def _http(port: int, path: str) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return response.read().decode() if response.status == 200 else None
    except OSError:
        return None


def kget(cluster: LocalCluster, *args: str) -> dict:
    return get_json(cluster, "-n", NS, *args)


def apply(cluster: LocalCluster, name: str, spec_patch: dict) -> None:
    obj = merge_patch(load_sample(), {"metadata": {"name": name}, "spec": spec_patch})
    cluster.kubectl("apply", "-n", NS, "-f", "-", input=json.dumps(obj))


def patch(cluster: LocalCluster, name: str, spec_patch: dict) -> None:
    body = json.dumps({"spec": spec_patch})
    cluster.kubectl("patch", "dsv4", name, "-n", NS, "--type=merge", "-p", body)


def status(cluster: LocalCluster, name: str) -> dict:
    return kget(cluster, "dsv4", name).get("status") or {}


def condition(cluster: LocalCluster, name: str, ctype: str) -> dict:
    found = status(cluster, name).get("conditions") or []
    return next((c for c in found if c["type"] == ctype), {})


def pods(cluster: LocalCluster, instance: str) -> list[dict]:
    return kget(cluster, "pods", "-l", f"app.kubernetes.io/instance={instance}")["items"]


def all_ready(items: list[dict]) -> bool:
    return bool(items) and all(
        any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in p["status"].get("conditions") or []
        )
        for p in items
    )


def delete(cluster: LocalCluster, name: str) -> None:
    cluster.kubectl("delete", "dsv4", name, "-n", NS, "--wait=false")


@pytest.mark.parametrize(
    ("spec", "limit"),
    [(SINGLE, SINGLE_NODE_MAX), (MULTINODE, MULTINODE_MAX)],
    ids=["single", "multi"],
)
def test_a_name_at_the_limit_runs_canary_included_and_one_past_it_is_refused(ns, spec, limit):
    cluster, _, _ = ns
    name = ("m" if spec is MULTINODE else "s") + "x" * (limit - 1)
    past = merge_patch(load_sample(), {"metadata": {"name": name + "x"}, "spec": spec})
    refused = cluster.kubectl(
        "apply", "--dry-run=server", "-n", NS, "-f", "-", check=False, input=json.dumps(past)
    )
    assert refused.returncode != 0
    assert f"metadata.name: at most {limit} characters" in refused.stderr

    apply(cluster, name, spec)
    wait_for(f"{name} Ready", lambda: status(cluster, name).get("phase") == "Ready", 180)
    stable = pods(cluster, name)
    expected = 3 + (2 if spec is MULTINODE else 0)  # prefill, decode, router; + workers
    assert len(stable) == expected and all_ready(stable)
    patch(cluster, name, FP4)
    canary = f"{name}--canary"

    def canary_up() -> list[dict] | None:
        found = [p for p in pods(cluster, canary) if "router" not in p["metadata"]["name"]]
        return found if len(found) == expected - 1 and all_ready(found) else None

    for pod in wait_for("every canary engine pod created and Ready", canary_up, 120):
        hash_label = pod["metadata"]["labels"]["controller-revision-hash"]
        assert len(hash_label) <= 63 and hash_label.startswith(f"{canary}-")
    assert max(len(p["metadata"]["name"]) for p in pods(cluster, canary)) <= 63
    delete(cluster, name)


def test_an_oversized_pod_shows_the_schedulers_words_within_a_minute_then_degraded(ns):
    cluster, operator, port = ns
    name = "bigmem"
    started = time.monotonic()
    apply(
        cluster,
        name,
        {"decode": {"resources": {"memory": "3Ti"}}, "progressDeadlineSeconds": 10},
    )

    def said() -> dict | None:
        found = condition(cluster, name, "Progressing")
        return found if "Insufficient memory" in found.get("message", "") else None

    progressing = wait_for("'Insufficient memory' in the Progressing condition", said, 60)
    shown_after = time.monotonic() - started
    assert progressing["status"] == "True" and progressing["reason"] == "Unschedulable"
    assert f"decode pod {name}-decode-0: Unschedulable: 0/" in progressing["message"]

    def warned() -> bool:
        # A pass writes the status first, then its Events: the Warning follows the condition.
        selector = f"involvedObject.name={name}"
        events = kget(cluster, "events", "--field-selector", selector)["items"]
        return any(
            e["reason"] == "Unschedulable" and "Insufficient memory" in e["message"] for e in events
        )

    wait_for("an Unschedulable Warning naming the insufficient memory", warned, 30)

    def degraded() -> dict | None:
        found = condition(cluster, name, "Degraded")
        return found if found.get("reason") == "ProgressDeadlineExceeded" else None

    deadline = wait_for("Degraded at the progress deadline", degraded, 60)
    degraded_after = time.monotonic() - started
    assert deadline["status"] == "True"
    assert deadline["message"].startswith("no progress for 10s (spec.progressDeadlineSeconds)")
    assert "Insufficient memory" in deadline["message"]
    assert status(cluster, name)["phase"] == "Degraded"
    sample = f'dsv4_operator_progress_deadline_exceeded{{name="{name}",namespace="{NS}"}} 1.0'
    assert sample in (_http(port, "/metrics") or "")
    print(
        f"\nInsufficient memory in the status {shown_after:.1f}s after apply; "
        f"Degraded (deadline 10 s) after {degraded_after:.1f}s"
    )
    delete(cluster, name)


def test_a_canary_that_cannot_fit_ends_no_capacity_within_a_minute_saying_why(ns, capsys):
    cluster, _, _ = ns
    name = "bigcanary"
    apply(cluster, name, {})
    wait_for(f"{name} Ready", lambda: status(cluster, name).get("phase") == "Ready", 180)
    before = {p["metadata"]["uid"] for p in pods(cluster, name)}
    started = time.monotonic()
    patch(cluster, name, HICACHE_TOO_BIG)

    def no_capacity() -> dict | None:
        rollout = status(cluster, name).get("rollout") or {}
        return rollout if rollout.get("verdict") == "NoCapacity" else None

    rollout = wait_for("the canary to find no capacity", no_capacity, 60)
    took = time.monotonic() - started
    assert rollout["phase"] == "CanaryPending" and "rejectedRevision" not in rollout
    words = f"canary decode pod {name}--canary-decode-0: Unschedulable: 0/"
    why = rollout["verdictReason"]
    assert why.startswith("the canary cannot be placed: ") and words in why
    assert "Insufficient memory" in why
    assert {p["metadata"]["uid"] for p in pods(cluster, name)} == before, "stable untouched"
    common = ["-n", NS, "--kubeconfig", cluster.kubeconfig]
    assert main(["rollout", "report", name, *common]) == 0
    out = capsys.readouterr().out
    assert "NoCapacity (no probe ran)" in out and "Insufficient memory" in out
    assert main(["rollout", "status", name, *common]) == 0
    why = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("why"))
    assert "the canary cannot be placed" in why and "Insufficient memory" in why
    print(f"\noversized canary: NoCapacity {took:.1f}s after the flag change")
    delete(cluster, name)
