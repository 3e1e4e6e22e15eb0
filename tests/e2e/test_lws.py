"""Multi-node replicas on the real LeaderWorkerSet controller (kubernetes-sigs/lws, built by
hack/build-lws.sh and started by `dsv4ctl cluster up`), with fake GB200 NVL72 trays in two
NVLink domains (`nvidia.com/gpu.clique`, 18 trays each).

The shipped V4-Pro sample (manifests/samples/pro-gb200-nvl72.yaml: prefill 2 × 4 trays,
decode 1 × 8) is applied unchanged and lives through the module in order: Ready with every
replica inside one clique and each pod's rank from LWS; a killed worker takes its whole group
down and up again; decode scales through the scale subresource without a canary (the shipped
HPA passes a server-side dry run); a flag rollout rolls group by group, and no group ever has
live pods of two revisions.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from dsv4_dev.cluster.local import LocalCluster
from dsv4_dev.cluster.nodes import GPU_CLIQUE_LABEL, NodePool, node_manifests
from dsv4_engine.engine_config import MultiNode, place_pod
from dsv4_operator.api.crd import CRD_PATH
from dsv4_operator.api.samples import shipped_sample
from dsv4_operator.render.engine import DIST_INIT_PORT
from dsv4_operator.render.lws import LWS_GROUP_INDEX_LABEL, LWS_NAME_LABEL, LWS_WORKER_INDEX_LABEL
from dsv4_operator.render.meta import ANNOTATION_CONFIG_HASH
from tests.e2e.escapes import SERVED
from tests.e2e.helpers import get_json, operator_and_runtime, wait_for

pytestmark = [pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
NS = "lws-e2e"
NAME = "pro"
# Two NVL72 racks: 18 compute trays of 4 GB200 each, one clique per rack.  The sample's 16
# trays fit one rack however the scheduler places its groups.
GB200 = NodePool(
    prefix="e2e-gb200", count=36, cpus=144, memory="960Gi", gpus=4,
    gpu_product="NVIDIA-GB200", cliques=2,
)  # fmt: skip
PV = "lws-e2e-pro-weights"
IN_CANARY = ("CanaryStarting", "CanaryPending", "Probing")  # a person may promote in any


def pods(cluster: LocalCluster) -> list[dict[str, Any]]:
    items = get_json(cluster, "pods", "-n", NS, "-l", f"app.kubernetes.io/instance={NAME}")
    return [p for p in items["items"] if LWS_NAME_LABEL in p["metadata"]["labels"]]


def groups(found: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Pods by (LeaderWorkerSet, group index): one group per replica."""
    out: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for pod in found:
        labels = pod["metadata"]["labels"]
        out[(labels[LWS_NAME_LABEL], labels[LWS_GROUP_INDEX_LABEL])].append(pod)
    return out


def ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def status(cluster: LocalCluster) -> dict[str, Any]:
    return get_json(cluster, "dsv4", NAME, "-n", NS).get("status") or {}


def settled(cluster: LocalCluster) -> bool:
    found = pods(cluster)
    return status(cluster).get("phase") == "Ready" and len(found) == 16 and all(map(ready, found))


@pytest.fixture(scope="module")
def world(cluster: LocalCluster, tmp_path_factory):
    nodes = node_manifests([GB200])
    cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes})
    )
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_PATH))
    cluster.wait_established("crd/dsv4deployments.inference.dsv4.dev")
    cluster.kubectl("create", "namespace", NS, check=False)
    sample = shipped_sample("pro-gb200-nvl72")
    claim = sample["spec"]["model"]["pvc"]["claimName"]
    volume = [
        {
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": PV},
            "spec": {
                "capacity": {"storage": "2Ti"}, "accessModes": ["ReadOnlyMany"],
                "storageClassName": "", "hostPath": {"path": "/models"},
                "claimRef": {"namespace": NS, "name": claim},
            },
        },
        {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": NS},
            "spec": {
                "accessModes": ["ReadOnlyMany"], "storageClassName": "", "volumeName": PV,
                "resources": {"requests": {"storage": "2Ti"}},
            },
        },
    ]  # fmt: skip
    cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": volume})
    )
    logs = tmp_path_factory.mktemp("lws")
    operator, _ = operator_and_runtime(cluster, NS, logs)
    operator.start()
    try:
        started = time.monotonic()
        cluster.kubectl("apply", "-n", NS, "-f", "-", input=json.dumps(sample))
        wait_for("the pro sample Ready with its 16 pods", lambda: settled(cluster), 180)
        print(f"\n[lws e2e] pro sample Ready in {time.monotonic() - started:.0f} s")
        yield cluster, operator
    finally:
        cluster.kubectl("delete", "dsv4", NAME, "-n", NS, "--wait=false", check=False)
        operator.stop()
        cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)
        cluster.kubectl("delete", "pv", PV, "--wait=false", check=False)
        cluster.kubectl("delete", "node", *[n["metadata"]["name"] for n in nodes], check=False)
    assert "Traceback" not in operator.text()


def test_every_replica_is_one_lws_group_inside_one_clique_with_ranks_from_lws(world):
    cluster, _ = world
    cliques = {
        n["metadata"]["name"]: n["metadata"]["labels"].get(GPU_CLIQUE_LABEL)
        for n in get_json(cluster, "nodes")["items"]
    }
    by_group = groups(pods(cluster))
    assert {k: len(v) for k, v in by_group.items()} == {
        ("pro-prefill", "0"): 4,
        ("pro-prefill", "1"): 4,
        ("pro-decode", "0"): 8,
    }
    for key, members in by_group.items():
        domains = {cliques[p["spec"]["nodeName"]] for p in members}
        assert len(domains) == 1 and None not in domains, (key, domains)
        assert len({p["spec"]["nodeName"] for p in members}) == len(members)  # a tray each
    # What LWS's webhook gave each pod is what the engine turns into SGLang's rank and
    # rendezvous: worker index = node rank, the leader's stable name for every rank.
    for members in by_group.values():
        nnodes = len(members)
        for pod in members:
            env = {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}
            placed = place_pod(MultiNode(nnodes=nnodes, dist_init_port=DIST_INIT_PORT), env)
            labels = pod["metadata"]["labels"]
            assert placed.node_rank == int(labels[LWS_WORKER_INDEX_LABEL])
            leader = f"{labels[LWS_NAME_LABEL]}-{labels[LWS_GROUP_INDEX_LABEL]}"
            assert placed.dist_init_addr.startswith(f"{leader}.{labels[LWS_NAME_LABEL]}.{NS}:")
    roles = status(cluster)
    assert (roles["prefill"]["summary"], roles["decode"]["summary"]) == ("2/2", "1/1")


def test_killing_one_worker_restarts_its_whole_group_and_only_it(world):
    cluster, _ = world
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods(cluster)}
    # A killed worker is a container the kubelet restarts: KWOK plays the kubelet but kills
    # nothing, so the test reports the restart as a kubelet would.  (Not `kubectl delete pod`:
    # KWOK removes a deleted pod at once, where a kubelet keeps it Terminating for its grace
    # period, and LWS v0.9.0 recreates the group only if it reads the worker while
    # Terminating; on a loaded machine it missed it once and the group was never recreated.)
    restarted = [{"op": "replace", "path": "/status/containerStatuses/0/restartCount", "value": 1}]
    cluster.kubectl(
        "patch", "pod", "pro-decode-0-3", "-n", NS, "--subresource=status", "--type=json",
        "-p", json.dumps(restarted),
    )  # fmt: skip

    def group_replaced() -> bool:
        now = groups(pods(cluster))
        decode = now.get(("pro-decode", "0"), [])
        return len(decode) == 8 and all(
            ready(p) and p["metadata"]["uid"] != before[p["metadata"]["name"]] for p in decode
        )

    wait_for("every pod of decode's group recreated and Ready", group_replaced, 90)
    for pod in pods(cluster):
        if pod["metadata"]["labels"][LWS_NAME_LABEL] == "pro-prefill":
            assert pod["metadata"]["uid"] == before[pod["metadata"]["name"]]
    wait_for("Ready again", lambda: settled(cluster), 90)


def test_decode_scales_through_the_subresource_without_a_canary(world):
    cluster, _ = world
    hpa = ROOT / "manifests" / "autoscaling" / "pro-decode-hpa.yaml"
    cluster.kubectl("apply", "--dry-run=server", "-n", NS, "-f", str(hpa))
    scale = get_json(cluster, "dsv4", NAME, "-n", NS, "--subresource=scale")
    assert scale["spec"]["replicas"] == 1 and scale["status"]["replicas"] == 1
    assert scale["status"]["selector"].endswith(
        "component=decode,inference.dsv4.dev/group-role=leader"
    )
    cluster.kubectl("scale", "dsv4", NAME, "-n", NS, "--replicas=2")

    def decode_set_to(n: int) -> bool:
        lws = get_json(cluster, "leaderworkerset", "pro-decode", "-n", NS)
        return lws["spec"]["replicas"] == n

    wait_for("decode's LeaderWorkerSet at 2 replicas", lambda: decode_set_to(2), 30)
    prefill = get_json(cluster, "leaderworkerset", "pro-prefill", "-n", NS)
    assert prefill["spec"]["replicas"] == 2  # prefill untouched
    assert (status(cluster).get("rollout") or {}).get("phase") in (None, "Idle")
    canary = cluster.kubectl(
        "get",
        "leaderworkerset",
        "-n",
        NS,
        "-l",
        "app.kubernetes.io/instance=pro--canary",
        "-o",
        "name",
    )
    assert canary.stdout.strip() == ""
    cluster.kubectl("scale", "dsv4", NAME, "-n", NS, "--replicas=1")
    wait_for("decode back at 1 replica", lambda: decode_set_to(1), 30)
    wait_for("Ready again", lambda: settled(cluster), 90)


class GroupRevisions:
    """Watches the deployment's LWS pods.  A group incarnation is a leader pod and the
    workers LWS creates for it; when a group rolls, LWS deletes its leader and the old
    workers go with it (by garbage collection, so briefly after the new leader appears:
    retiring, never joined to it — SGLang ranks rendezvous once, at start).  Checked at
    every event: a worker created while a leader lives has that leader's engine-config
    revision.  Kept: each group's revisions among live pods, over time."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.live: dict[str, tuple[tuple[str, str], str]] = {}
        self.leaders: dict[tuple[str, str], str] = {}  # group -> its live leader's revision
        self.history: list[tuple[float, tuple[str, str], frozenset[str]]] = []
        self.violations: list[str] = []
        self._proc: subprocess.Popen[str] | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        kubectl = str(Path(sys.executable).with_name("kubectl"))
        self._proc = subprocess.Popen(
            [kubectl, "--kubeconfig", self.cluster.kubeconfig, "get", "pods", "-n", NS, "-w",
             "-l", LWS_NAME_LABEL, "--output-watch-events", "-o", "json"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self._thread.start()

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(10)
        self._thread.join(10)

    def _run(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        decoder, buffer = json.JSONDecoder(), ""
        for line in self._proc.stdout:
            buffer += line
            try:
                event, end = decoder.raw_decode(buffer.lstrip())
            except ValueError:
                continue
            buffer = buffer.lstrip()[end:]
            self._see(event["type"], event["object"])

    def _see(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        labels = meta["labels"]
        group = (labels[LWS_NAME_LABEL], labels[LWS_GROUP_INDEX_LABEL])
        revision = (meta.get("annotations") or {}).get(ANNOTATION_CONFIG_HASH, "")
        leader = labels[LWS_WORKER_INDEX_LABEL] == "0"
        gone = kind == "DELETED" or bool(meta.get("deletionTimestamp"))
        if gone:
            self.live.pop(meta["name"], None)
            if leader:
                self.leaders.pop(group, None)
        else:
            if kind == "ADDED" and not leader and group in self.leaders:
                if self.leaders[group] != revision:
                    self.violations.append(
                        f"worker {meta['name']} ({revision}) created beside leader "
                        f"({self.leaders[group]})"
                    )
            if leader:
                self.leaders[group] = revision
            self.live[meta["name"]] = (group, revision)
        seen = frozenset(r for g, r in self.live.values() if g == group)
        self.history.append((time.monotonic(), group, seen))

    def first_all(self, group: tuple[str, str], revision: str) -> float | None:
        """When ``group``'s live pods first were all of ``revision``."""
        return next((t for t, g, seen in self.history if g == group and seen == {revision}), None)


def config_hashes(cluster: LocalCluster) -> dict[tuple[str, str], set[str]]:
    return {
        g: {p["metadata"]["annotations"][ANNOTATION_CONFIG_HASH] for p in members}
        for g, members in groups(pods(cluster)).items()
    }


def test_a_flag_rollout_rolls_group_by_group_and_no_group_mixes_revisions(world):
    cluster, _ = world
    before = config_hashes(cluster)
    assert all(len(h) == 1 for h in before.values())
    watch = GroupRevisions(cluster)
    watch.start()
    try:
        # Rolled in place (spec.rollout.promotion: InPlace): what is tested is how a
        # LeaderWorkerSet replaces its groups; the default surge needs a spare group of
        # nodes, which this cluster does not have once the sample runs.
        rollout = {"stableProbeIntervalSeconds": 0, "promotion": "InPlace"}
        flags = {"features": {"kvCanary": "raise"}, "rollout": rollout}
        cluster.kubectl(
            "patch", "dsv4", NAME, "-n", NS, "--type=merge", "-p", json.dumps({"spec": flags})
        )
        wait_for(
            "the canary rollout started",
            lambda: (status(cluster).get("rollout") or {}).get("phase") in IN_CANARY,
            60,
        )
        dsv4ctl = str(Path(sys.executable).with_name("dsv4ctl"))
        promote = subprocess.run(
            [dsv4ctl, "rollout", "promote", NAME, "-n", NS],
            capture_output=True, text=True, env=cluster.env, timeout=60,
        )  # fmt: skip
        assert promote.returncode == 0, promote.stderr

        def rolled() -> bool:
            now = config_hashes(cluster)
            return (
                settled(cluster)
                and (status(cluster).get("rollout") or {}).get("phase") == "Idle"
                and set(now) == set(before)
                and all(len(now[g]) == 1 and now[g] != before[g] for g in before)
            )

        wait_for("every group on the new flags, Ready", rolled, 180)
    finally:
        watch.stop()
    assert not watch.violations, watch.violations[:5]
    after = {g: next(iter(h)) for g, h in config_hashes(cluster).items()}
    switched = {g: watch.first_all(g, after[g]) for g in before}
    assert None not in switched.values(), switched
    # Decode first (spec.rollout.order), then prefill one group after the other: when the
    # first prefill group runs the new flags, the other still has all its old pods live.
    first, second = sorted((("pro-prefill", i) for i in ("0", "1")), key=switched.__getitem__)
    assert switched[("pro-decode", "0")] < switched[first]
    then = [seen for t, g, seen in watch.history if g == second and t <= switched[first]]
    assert then and then[-1] == before[second], then[-1:]


def test_the_admission_fence_holds_for_leaderworkersets(world):
    """The fence (manifests/base/fence.yaml) checks both pod templates of an LWS the
    operator's account writes: a rendered one passes, a worker template under another
    account, a leader template mounting a token, or an unmanaged one is refused."""
    cluster, _ = world
    operator = "system:serviceaccount:dsv4-system:dsv4-operator"
    base = ROOT / "manifests" / "base"
    # Installed for the rest of the session, never deleted: on Kubernetes 1.36 removing the
    # last binding with a ConfigMap paramKind stops the API server's ConfigMap parameter
    # informer for good (kubernetes#133827, docs/install.md), and every later install's
    # fence would then deny each write in a served namespace.
    cluster.kubectl("create", "namespace", "dsv4-system", check=False)
    cluster.kubectl("label", "namespace", NS, f"{SERVED}=true", "--overwrite")  # served
    for path in (base / "rbac.yaml", base / "fence.yaml"):
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    rendered = get_json(cluster, "leaderworkerset", "pro-decode", "-n", NS)
    lws = {
        "apiVersion": rendered["apiVersion"],
        "kind": rendered["kind"],
        "metadata": {
            "name": "fenced",
            "namespace": NS,
            "labels": rendered["metadata"]["labels"],
        },
        "spec": rendered["spec"],
    }

    def dry_run(obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return cluster.kubectl(
            "create", "--dry-run=server", f"--as={operator}", "-f", "-",
            input=json.dumps(obj), check=False,
        )  # fmt: skip

    # The policy takes effect a moment after it is applied.
    wait_for(
        "the fence refusing an unmanaged LWS",
        lambda: dry_run({**lws, "metadata": {**lws["metadata"], "labels": {}}}).returncode != 0,
        30,
    )
    assert dry_run(lws).returncode == 0, dry_run(lws).stderr
    group = lws["spec"]["leaderWorkerTemplate"]
    other_account = json.loads(json.dumps(lws))
    other_account["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"][
        "serviceAccountName"
    ] = "admin"
    token = json.loads(json.dumps(lws))
    token["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"][
        "automountServiceAccountToken"
    ] = True
    for refused in (other_account, token):
        result = dry_run(refused)
        assert result.returncode != 0 and "dsv4-operator-fence" in result.stderr
        assert "mount no" in result.stderr and "ServiceAccount token" in result.stderr
    assert group["leaderTemplate"]["spec"]["automountServiceAccountToken"] is False
