"""The operator end to end on the real local cluster (API server, controllers, KWOK B200 nodes).

The operator runs as a real subprocess with the cluster's KUBECONFIG (the development
launcher, `dsv4-operator-dev run`: the image's operator plus its request counter and crash
injection); every wait is bounded.  Tests run in file order on one namespace: the sample is created, changed, then
deleted, as a user would.
"""

import datetime as dt
import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter

import pytest

from dsv4_operator.api import CRD_NAME
from dsv4_operator.api.crd import CRD_PATH
from dsv4_operator.api.rollout import RolloutStatus
from dsv4_operator.api.samples import load_sample, merge_patch
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.rollout import manual
from dsv4_operator.rollout.decide import ManualAction, first_status
from dsv4_operator.rollout.slices import spec_revision
from dsv4_operator.runtime import USER_AGENT
from tests.e2e.helpers import apply, audit_events, get_json, wait_for
from tests.unit.operator.harness import MODEL_HOST_PATHS

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NS = "dsv4-e2e"
CHILD_KINDS = "configmaps,statefulsets,services,poddisruptionbudgets,deployments,serviceaccounts,roles,rolebindings,networkpolicies"
WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE")


def expected_children(name):
    return {
        ("ConfigMap", f"{name}-prefill-engine"),
        ("ConfigMap", f"{name}-decode-engine"),
        ("StatefulSet", f"{name}-prefill"),
        ("StatefulSet", f"{name}-decode"),
        ("Service", f"{name}-prefill"),
        ("Service", f"{name}-decode"),
        ("PodDisruptionBudget", f"{name}-prefill"),
        ("PodDisruptionBudget", f"{name}-decode"),
        ("Deployment", f"{name}-router"),
        ("Service", f"{name}-router"),
        ("ServiceAccount", f"{name}-router"),
        ("RoleBinding", f"{name}-router-discovery"),
        ("PodDisruptionBudget", f"{name}-router"),
        ("NetworkPolicy", f"{name}-engines"),
    }


def engine_yaml(ns, name, role):
    """A role's `engine.yaml`, from the ConfigMap its StatefulSet's pods mount."""
    template = kget(ns, "statefulset", f"{name}-{role}")["spec"]["template"]
    (volume,) = [v for v in template["spec"]["volumes"] if v["name"] == "engine-config"]
    return kget(ns, "configmap", volume["configMap"]["name"])["data"][f"{role}.yaml"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Operator:
    """`dsv4-operator-dev run` as a subprocess, with its health and request-count endpoints."""

    def __init__(self, cluster, identity, log_dir, *extra):
        self.port = free_port()
        self.log = log_dir / f"operator-{identity}-{self.port}.log"
        command = [
            sys.executable, "-m", "dsv4_dev.operator", "run",
            "--namespace", NS,
            "--lease-namespace", NS,
            "--lease-seconds", "6",
            "--resync-seconds", "2",
            "--health-port", str(self.port),
            "--identity", identity,
            "--probe-image", "ghcr.io/dsv4/operator:test",  # probe Jobs: none run here
            "--allowed-model-host-paths", ",".join(MODEL_HOST_PATHS),
            *extra,
        ]  # fmt: skip
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                command, env=cluster.env, stdout=out, stderr=subprocess.STDOUT
            )

    def get(self, path):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())
        except OSError:
            return None, None

    def ready(self):
        return self.get("/readyz")[0] == 200

    def counts(self):
        status, body = self.get("/debug/requests")
        assert status == 200, f"operator not answering: {self.tail()}"
        return body

    def passes(self):
        status, body = self.get("/debug/passes")
        assert status == 200, f"operator not answering: {self.tail()}"
        return body["passes"]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def tail(self):
        return self.log.read_text()[-3000:]


def kget(cluster, *args):
    return get_json(cluster, "-n", NS, *args)


def patch(cluster, name, spec_patch):
    cluster.kubectl(
        "patch", "dsv4", name, "-n", NS, "--type=merge", "-p", json.dumps({"spec": spec_patch})
    )


def sample(name, spec_patch=None):
    return merge_patch(load_sample(), {"metadata": {"name": name}, "spec": spec_patch or {}})


def status(cluster, name):
    return kget(cluster, "dsv4", name).get("status") or {}


def children(cluster, name):
    """(kind, name) → object; a role's engine ConfigMap without its content hash."""
    items = kget(cluster, CHILD_KINDS, "-l", f"app.kubernetes.io/instance={name}")["items"]
    return {
        (o["kind"], re.sub(r"-engine-[0-9a-f]+$", "-engine", o["metadata"]["name"])): o
        for o in items
    }


def pods(cluster, name, component=None):
    selector = f"app.kubernetes.io/instance={name}"
    if component:
        selector += f",app.kubernetes.io/component={component}"
    return kget(cluster, "pods", "-l", selector)["items"]


def pod_ready(pod):
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def wait_phase(cluster, name, phase, timeout=180):
    return wait_for(
        f"{name} phase {phase}",
        lambda: (
            (s := status(cluster, name)).get("phase") == phase
            and s.get("observedGeneration") == kget(cluster, "dsv4", name)["metadata"]["generation"]
            and s
        ),
        timeout,
    )


def versions(objs):
    """What changes when an object's spec changes: generation if it has one, else the RV."""
    return {
        k: o["metadata"].get("generation") or o["metadata"]["resourceVersion"]
        for k, o in objs.items()
    }


def write_paths(before, after):
    """Write requests the operator sent between two /debug/requests snapshots."""
    old = Counter({(r["verb"], r["path"]): r["count"] for r in before["requests"]})
    new = Counter({(r["verb"], r["path"]): r["count"] for r in after["requests"]})
    return {k: n for k, n in (new - old).items() if k[0] in WRITE_VERBS and "/leases" not in k[1]}


def audit_offset(cluster):
    return cluster.audit_log.stat().st_size


def audited(cluster, offset):
    """Requests of the operator process (its client and kopf's) that the API server's audit
    log recorded after byte `offset`, but lease renewals and watches: (verb, URI) each."""
    return [
        (e["verb"], e["requestURI"])
        for e in audit_events(cluster, offset)
        if e.get("stage") == "ResponseComplete"
        and e.get("userAgent", "").startswith((USER_AGENT, "kopf"))
        and e["verb"] != "watch"
        and e.get("objectRef", {}).get("resource") != "leases"
    ]


@pytest.fixture(scope="module")
def ns(cluster):
    # This module's operator starts before its CRD is served (`operator`): the CRD an
    # earlier module applied goes first (with any DSV4Deployment it left).
    cluster.kubectl("delete", "crd", CRD_NAME, "--ignore-not-found", "--wait=true")
    cluster.kubectl("create", "namespace", NS, check=False)
    yield cluster
    cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)


@pytest.fixture(scope="module")
def operator(ns, tmp_path_factory):
    """Started before its CRD is served, as a namespaced install can be (kopf finds CRDs only
    as it starts): it waits, unready, saying which CRD is missing, and once the CRD is
    applied it serves it, which every test of the module then relies on."""
    log_dir = tmp_path_factory.mktemp("operator-logs")
    op = Operator(ns, "e2e-main", log_dir)

    def waiting_for_the_crd() -> bool:
        assert op.proc.poll() is None, f"the operator exited: {op.tail()}"
        return f"the {CRD_NAME} CRD is not served" in op.log.read_text()

    wait_for("the operator saying its CRD is not served", waiting_for_the_crd, 60)
    assert not op.ready(), "ready while its CRD is not served"
    ns.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_PATH))
    ns.wait_established(f"crd/{CRD_NAME}")
    wait_for("operator ready", op.ready, 90)
    handle = {"op": op, "log_dir": log_dir}
    yield handle
    handle["op"].stop()  # a test may have replaced it (a restart)


def test_sample_creates_every_child_and_becomes_ready_on_b200(ns, operator):
    apply(ns, namespace=NS, manifest=sample("flash"))
    st = wait_phase(ns, "flash", "Ready")
    assert set(children(ns, "flash")) == expected_children("flash")
    engine = pods(ns, "flash", "prefill") + pods(ns, "flash", "decode")
    assert len(engine) == 2 and all(pod_ready(p) for p in engine)
    assert {p["spec"]["nodeName"] for p in engine} <= set(ns.gpu_nodes)
    assert all(
        p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4" for p in engine
    )
    assert all(pod_ready(p) for p in pods(ns, "flash", "router"))
    conditions = {c["type"]: c["status"] for c in st["conditions"]}
    assert conditions == {
        "Ready": "True",
        "Progressing": "False",
        "Reconciling": "False",
        "Degraded": "False",
        "Stalled": "False",
    }

    # The status is one atomic value to field management: the operator's entry for it is a
    # single field, not one per leaf, which cheapens every status write (docs/dsv4deployment.md#scale).
    stored = get_json(ns, "dsv4", "flash", "-n", NS, "--show-managed-fields")
    assert [
        (m["manager"], m["fieldsV1"])
        for m in stored["metadata"]["managedFields"]
        if m.get("subresource") == "status"
    ] == [("dsv4-operator", {"f:status": {}})]
    # A pass's renders are kept under its rollout status's JSON (`RenderMemory`): read back
    # from the API server, the status the first pass decided must give that same JSON, or
    # every later pass renders its children again.
    read_back = RolloutStatus.model_validate(stored["status"]["rollout"])
    decided = first_status(
        spec_revision(DSV4DeploymentSpec.model_validate(stored["spec"])), dt.datetime.now(dt.UTC)
    )
    since = read_back.phase_since  # the first pass's clock, not this test's
    history = tuple(h.model_copy(update={"promoted_at": since}) for h in decided.status.history)
    as_decided = decided.status.model_copy(update={"phase_since": since, "history": history})
    assert read_back.model_dump_json() == as_decided.model_dump_json()

    table = ns.kubectl("get", "dsv4", "flash", "-n", NS).stdout.splitlines()
    assert table[0].split() == [
        "NAME", "PHASE", "PREFILL", "DECODE", "HICACHE", "INDEXDTYPE", "CANARY", "TRANSFER",
        "AGE",
    ]  # fmt: skip
    assert table[1].split()[:6] == ["flash", "Ready", "1/1", "1/1", "false", "fp8"]

    def reasons():
        items = kget(ns, "events", "--field-selector", "involvedObject.name=flash")["items"]
        return {e["reason"] for e in items}

    # A pass writes its Events after the status that records its decision: wait for them.
    wait_for("the pass's Events", lambda: {"Initialized", "PhaseReady"} <= reasons(), 30)


def test_steady_state_passes_send_no_request_at_all(ns, operator):
    """Passes read the watch-fed cache: in steady state the operator's only requests are its
    lease renewals and its watches (docs/dsv4deployment.md#scale)."""
    op = operator["op"]
    wait_phase(ns, "flash", "Ready")
    time.sleep(3)  # let the controllers' last status updates pass
    before, offset, passes = op.counts(), audit_offset(ns), op.passes()
    time.sleep(12)  # about six resync passes at --resync-seconds 2
    after, ran = op.counts(), op.passes() - passes
    requests = audited(ns, offset)
    client_writes = write_paths(before, after)
    print(
        f"\nsteady state over 12 s: {ran} reconcile passes, {len(requests)} requests but lease "
        f"renewals and watches in the API server's audit log, "
        f"{sum(client_writes.values())} writes counted by the operator's client"
    )
    assert ran >= 4, "the resync did not reconcile"
    assert requests == [] and client_writes == {}
    assert after["writes"] == before["writes"]


def test_decode_replicas_change_touches_only_decode_objects(ns, operator):
    op = operator["op"]
    wait_phase(ns, "flash", "Ready")
    before_objs, before = versions(children(ns, "flash")), op.counts()
    patch(ns, "flash", {"decode": {"replicas": 2}})
    wait_for(
        "decode 2/2", lambda: status(ns, "flash").get("decode", {}).get("summary") == "2/2", 120
    )
    wait_phase(ns, "flash", "Ready")
    after_objs = versions(children(ns, "flash"))
    changed = {k for k in before_objs if before_objs[k] != after_objs.get(k)}
    assert changed == {("StatefulSet", "flash-decode")}
    # Events are no children: created (POST), or a repeat counted on the first (PATCH).
    touched = {
        path
        for (verb, path) in write_paths(before, op.counts())
        if verb != "POST" and "/events/" not in path
    }
    assert touched == {
        f"/apis/apps/v1/namespaces/{NS}/statefulsets/flash-decode",
        f"/apis/inference.dsv4.dev/v1alpha1/namespaces/{NS}/dsv4deployments/flash/status",
    }
    decode = pods(ns, "flash", "decode")
    assert len(decode) == 2 and len({p["spec"]["nodeName"] for p in decode}) == 2


def test_feature_flag_change_changes_the_hash_and_rolls_affected_pods(ns, operator):
    wait_phase(ns, "flash", "Ready")
    hash_key = "inference.dsv4.dev/engine-config-hash"
    before = {
        p["metadata"]["uid"]: p for p in pods(ns, "flash", "prefill") + pods(ns, "flash", "decode")
    }
    old_revision = status(ns, "flash")["engineRevision"]
    # Promoted in place, as spec.rollout.promotion may ask (no spare GPUs): only the pods
    # whose engine configuration changes are replaced, where they run.
    hicache = {"hicache": {"enabled": True, "ratio": 2.0, "roles": ["decode"]}}
    patch(ns, "flash", {"features": hicache, "rollout": {"promotion": "InPlace"}})

    # New flags go to a canary slice first; the stable pods keep running the old flags.
    def canary_exists():
        probe = ns.kubectl("get", "statefulset", "flash--canary-decode", "-n", NS, check=False)
        return probe.returncode == 0

    # The status records the decision before the canary's objects are applied: wait for both.
    starting = wait_for(
        "rollout phase CanaryStarting",
        lambda: (
            (r := status(ns, "flash").get("rollout", {})).get("phase") == "CanaryStarting" and r
        ),
        60,
    )
    wait_for("canary slice", canary_exists, 60)
    assert {p["metadata"]["uid"] for p in pods(ns, "flash", "decode")} <= set(before)
    # HiCache keeps the prefill→decode transfer format: it may be promoted role by role.
    assert starting["transfer"] == "compatible"
    # Nothing answers for the canary here (no local runtime in this test): a person promotes
    # the flags this canary runs (a control names them; it acts once and is removed).
    control = manual.encode(ManualAction.PROMOTE, "e2e", starting["canaryRevision"])
    ns.kubectl(
        "annotate", "dsv4", "flash", "-n", NS, "--overwrite", f"{manual.ANNOTATION}={control}"
    )

    def rolled():
        decode = pods(ns, "flash", "decode")
        return (
            len(decode) == 2
            and all(p["metadata"]["uid"] not in before and pod_ready(p) for p in decode)
            and decode
        )

    decode = wait_for("decode pods replaced", rolled, 180)

    def promoted():
        st = status(ns, "flash")
        return st if st["rollout"]["phase"] == "Idle" and st.get("phase") == "Ready" else None

    st = wait_for("promotion finished and Ready", promoted, 120)
    prefill = pods(ns, "flash", "prefill")
    assert [p["metadata"]["uid"] for p in prefill] == [
        uid
        for uid, p in before.items()
        if p["metadata"]["labels"]["app.kubernetes.io/component"] == "prefill"
    ], "prefill does not use HiCache here and must not roll"
    old_decode_hash = next(
        p["metadata"]["annotations"][hash_key] for p in before.values()
        if p["metadata"]["labels"]["app.kubernetes.io/component"] == "decode"
    )  # fmt: skip
    assert {p["metadata"]["annotations"][hash_key] for p in decode} != {old_decode_hash}
    decode_yaml = engine_yaml(ns, "flash", "decode")
    assert "enabled: true" in decode_yaml and "enabled: false" in engine_yaml(
        ns, "flash", "prefill"
    )
    assert st["engineRevision"] != old_revision and st["activeFeatures"]["hicache"]["enabled"]
    assert ns.kubectl("get", "dsv4", "flash", "-n", NS).stdout.splitlines()[1].split()[4] == "true"
    wait_for(
        "canary deleted after promotion",
        lambda: (
            ns.kubectl(
                "get", "statefulset", "flash--canary-decode", "-n", NS, check=False
            ).returncode
            != 0
        ),
        60,
    )
    assert status(ns, "flash")["rollout"]["verdict"] == "MANUAL_PROMOTE"
    # Handled once: its token is the status's, and the annotation stays as written (the
    # operator writes the status only).
    obj = kget(ns, "dsv4", "flash")
    control = manual.parse(obj["metadata"].get("annotations"))
    assert control is not None and obj["status"]["rollout"]["handledAction"] == control.token


def test_missing_prerequisites_set_degraded_without_crashing(ns, operator):
    apply(
        ns, namespace=NS, manifest=sample("nogpu", {"placement": {"gpuProducts": ["NVIDIA-H100"]}})
    )
    apply(
        ns,
        namespace=NS,
        manifest=sample(
            "nopvc", {"model": {"hostPath": None, "pvc": {"claimName": "no-such-claim"}}}
        ),
    )
    # The operator allows /data/models (MODEL_HOST_PATHS) and nothing else of the node's.
    apply(ns, namespace=NS, manifest=sample("hostetc", {"model": {"hostPath": "/etc"}}))
    for name, reason, field in (
        ("nogpu", "NoAllowedGPUNodes", "spec.placement.gpuProducts"),
        ("nopvc", "PVCNotFound", "spec.model.pvc.claimName"),
        ("hostetc", "HostPathNotAllowed", "spec.model.hostPath: /etc is not under"),
    ):
        st = wait_phase(ns, name, "Degraded", timeout=60)
        degraded = next(c for c in st["conditions"] if c["type"] == "Degraded")
        assert degraded["status"] == "True" and degraded["reason"] == reason
        assert field in degraded["message"]
        assert children(ns, name) == {}
    assert operator["op"].proc.poll() is None and operator["op"].ready()
    ns.kubectl("delete", "dsv4", "nogpu", "nopvc", "hostetc", "-n", NS)


def test_a_standby_replica_never_acts(ns, operator):
    standby = Operator(ns, "e2e-standby", operator["log_dir"])
    try:
        wait_for("standby alive", lambda: standby.get("/healthz")[0] == 200, 60)
        patch(ns, "flash", {"router": {"replicas": 2}})
        wait_for(
            "router 2/2", lambda: status(ns, "flash").get("router", {}).get("summary") == "2/2", 120
        )
        assert standby.get("/readyz")[0] == 503
        assert standby.counts()["writes"] == 0
    finally:
        standby.stop()


def test_killed_mid_reconcile_then_restarted_converges_without_duplicates(ns, operator):
    operator["op"].stop()  # hands the Lease over
    crasher = Operator(ns, "e2e-crash", operator["log_dir"], "--crash-after-writes", "4")
    apply(ns, namespace=NS, manifest=sample("kill"))
    assert crasher.proc.wait(90) == 137, crasher.tail()
    partial = children(ns, "kill")
    assert 0 < len(partial) < len(expected_children("kill")), "the crash was not mid-reconcile"

    operator["op"] = Operator(ns, "e2e-main", operator["log_dir"])  # waits out the dead Lease
    wait_phase(ns, "kill", "Ready")
    assert set(children(ns, "kill")) == expected_children("kill")
    engine = pods(ns, "kill", "prefill") + pods(ns, "kill", "decode")
    assert len(engine) == 2 and len({p["metadata"]["name"] for p in engine}) == 2
    kinds = Counter(kind for kind, _ in children(ns, "kill"))
    assert kinds["StatefulSet"] == 2 and kinds["ConfigMap"] == 2 and kinds["Deployment"] == 1


def test_deleting_the_resource_removes_every_child(ns, operator):
    ns.kubectl("delete", "dsv4", "flash", "kill", "-n", NS)
    for name in ("flash", "kill"):
        wait_for(
            f"{name} children gone", lambda n=name: not children(ns, n) and not pods(ns, n), 120
        )
    assert kget(ns, "dsv4")["items"] == []
