"""The local control plane is real: scheduler, controller-manager, GC and API validation work."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import uuid
from pathlib import Path

from dsv4_dev.cluster.local import SERVICE_IP_RANGE, LocalCluster
from tests.e2e.escapes import SERVED
from tests.e2e.helpers import apply, get_json, wait_for

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def gpu_pod(name: str, gpus: int) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-B200"},
            "tolerations": [GPU_TOLERATION],
            "containers": [
                {
                    "name": "engine",
                    "image": "example.invalid/engine:1",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
        },
    }


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def test_fake_b200_nodes_are_ready_with_gpu_capacity(cluster: LocalCluster):
    nodes = get_json(cluster, "nodes")["items"]
    gpu = [
        n for n in nodes if n["metadata"]["labels"].get("nvidia.com/gpu.product") == "NVIDIA-B200"
    ]
    assert len(gpu) >= 4
    for node in gpu:
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert node["metadata"]["labels"]["nvidia.com/gpu.count"] == "8"
        assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in node[
            "spec"
        ]["taints"]
        ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
        assert ready == "True"
    cpu = [n for n in nodes if "nvidia.com/gpu.product" not in n["metadata"]["labels"]]
    assert len(cpu) >= 2
    # `up` returns once the node lifecycle controller has lifted the not-ready taint the
    # API server puts on every new node: a node that reports Ready but keeps it takes no pod.
    for node in nodes:
        keys = {t["key"] for t in node["spec"].get("taints") or []}
        assert not keys & {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}


def test_the_service_ip_range_holds_thousands_of_services(cluster: LocalCluster):
    """One router Service per deployment: the API server's default range (a /24) would
    refuse the 255th (bench-scale creates 500)."""
    name = unique("svc")
    apply(cluster, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
                    "spec": {"ports": [{"port": 80}]}})  # fmt: skip
    ip = get_json(cluster, "service", name)["spec"]["clusterIP"]
    assert ipaddress.ip_address(ip) in ipaddress.ip_network(SERVICE_IP_RANGE)
    assert ipaddress.ip_network(SERVICE_IP_RANGE).num_addresses >= 4096
    cluster.kubectl("delete", "service", name)


def test_the_controller_manager_and_scheduler_elect_no_leader(cluster: LocalCluster):
    """One of each runs: neither takes a Lease in kube-system (renewed every 2 s, each
    renewal a write the API server and etcd pay in every cluster a session keeps up)."""
    leases = get_json(cluster, "lease", "-n", "kube-system")["items"]
    held = {lease["metadata"]["name"] for lease in leases}
    assert not held & {"kube-controller-manager", "kube-scheduler"}, held


def test_pod_with_8_gpus_runs_on_a_b200_node(cluster: LocalCluster):
    name = unique("gpu8")
    apply(cluster, gpu_pod(name, 8))

    def ready_pod():
        pod = get_json(cluster, "pod", name)
        conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
        return (
            pod
            if pod["status"].get("phase") == "Running" and conditions.get("Ready") == "True"
            else None
        )

    pod = wait_for(f"pod {name} Running and Ready", ready_pod)
    assert pod["spec"]["nodeName"] in cluster.gpu_nodes
    cluster.kubectl("delete", "pod", name, "--wait=false")


def test_pod_with_9_gpus_stays_pending_with_failed_scheduling(cluster: LocalCluster):
    name = unique("gpu9")
    apply(cluster, gpu_pod(name, 9))

    def failed_scheduling():
        events = get_json(cluster, "events", "--field-selector", f"involvedObject.name={name}")
        return [e for e in events["items"] if e["reason"] == "FailedScheduling"]

    events = wait_for(f"FailedScheduling event for {name}", failed_scheduling)
    assert "nvidia.com/gpu" in events[0]["message"]
    pod = get_json(cluster, "pod", name)
    assert pod["status"]["phase"] == "Pending"
    assert not pod["spec"].get("nodeName")
    cluster.kubectl("delete", "pod", name, "--wait=false")


def test_deployment_replicaset_creates_pods(cluster: LocalCluster):
    name = unique("web")
    labels = {"app": name}
    apply(
        cluster,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name},
            "spec": {
                "replicas": 3,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "c", "image": "example.invalid/web:1"}]},
                },
            },
        },
    )

    def available():
        status = get_json(cluster, "deployment", name).get("status", {})
        return status if status.get("availableReplicas") == 3 else None

    wait_for(f"deployment {name} with 3 available replicas", available)
    pods = get_json(cluster, "pods", "-l", f"app={name}")["items"]
    assert len(pods) == 3
    owner = pods[0]["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "ReplicaSet"
    cluster.kubectl("delete", "deployment", name, "--wait=false")


def test_deleting_owner_garbage_collects_dependent(cluster: LocalCluster):
    owner_name, child_name = unique("owner"), unique("child")
    apply(cluster, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": owner_name}})
    uid = get_json(cluster, "configmap", owner_name)["metadata"]["uid"]
    apply(
        cluster,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": child_name,
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": owner_name, "uid": uid}
                ],
            },
        },
    )
    cluster.kubectl("delete", "configmap", owner_name)

    def child_gone():
        return cluster.kubectl("get", "configmap", child_name, check=False).returncode != 0

    wait_for(f"garbage collection of {child_name}", child_gone)


def test_api_server_rejects_object_violating_crd_schema(cluster: LocalCluster):
    group = "e2e.dsv4.dev"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {"replicas": {"type": "integer", "minimum": 0}},
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
    apply(cluster, crd)
    cluster.wait_established(f"crd/widgets.{group}")
    good = {
        "apiVersion": f"{group}/v1",
        "kind": "Widget",
        "metadata": {"name": "ok"},
        "spec": {"replicas": 1},
    }
    apply(cluster, good)
    bad = dict(good, metadata={"name": "bad"}, spec={"replicas": -1})
    result = cluster.kubectl("apply", "-f", "-", input=json.dumps(bad), check=False)
    assert result.returncode != 0
    assert "spec.replicas" in result.stderr
    assert "greater than or equal to 0" in result.stderr
    wrong_type = dict(good, metadata={"name": "bad2"}, spec={"replicas": "three"})
    result = cluster.kubectl("apply", "-f", "-", input=json.dumps(wrong_type), check=False)
    assert result.returncode != 0
    assert "spec.replicas" in result.stderr


def test_cluster_up_then_down_leaves_no_process(tmp_path):
    """The CLI path a user takes: `up` shows Ready B200 nodes, `down` stops everything."""
    from dsv4_operator.cli.main import main

    workdir = str(tmp_path / "kwok")
    common = ["cluster", "--name", "updown", "--workdir", workdir]
    assert main([*common, "up", "--gpu-nodes", "1", "--cpu-nodes", "1"]) == 0
    local = LocalCluster(name="updown", workdir=tmp_path / "kwok")
    try:
        out = local.kubectl("get", "nodes", "-L", "nvidia.com/gpu.product").stdout
        assert "NVIDIA-B200" in out and "Ready" in out
        assert local.leftover_pids(), "a running cluster has processes"
        assert main([*common, "up", "--gpu-nodes", "1", "--cpu-nodes", "1"]) == 0  # idempotent
    finally:
        assert main([*common, "down"]) == 0
    assert local.leftover_pids() == []
    assert not local.exists()


def test_a_fence_reinstalled_on_the_same_api_server_denies_every_write_it_matches(tmp_path):
    """Kubernetes 1.36's trap for an uninstall then reinstall (kubernetes#133827, as
    docs/install.md warns): deleting the fence's bindings, the last with a ConfigMap
    paramKind, stops the API server's ConfigMap parameter informer for good, so the
    reinstalled fence finds no settings and denies every pod write in a served namespace,
    the admin's included.  Its own throwaway cluster: the one it breaks stays broken."""
    base = Path(__file__).resolve().parents[2] / "manifests" / "base"
    fence = str(base / "fence.yaml")
    local = LocalCluster(name="reinstall", workdir=tmp_path / "kwok")
    local.up(log=lambda message: None)
    try:
        local.kubectl("create", "namespace", "dsv4-system")
        local.kubectl("create", "namespace", "served")
        local.kubectl("label", "namespace", "served", f"{SERVED}=true")
        local.kubectl("apply", "--server-side", "-f", str(base / "rbac.yaml"))
        pod = {**gpu_pod("fenced", 1), "metadata": {"name": "fenced"}}
        theirs = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "theirs"}}
        operator = "--as=system:serviceaccount:dsv4-system:dsv4-operator"

        def dry_run(obj: dict, *account: str) -> subprocess.CompletedProcess[str]:
            return local.kubectl(
                "create", "--dry-run=server", "-n", "served", *account, "-f", "-",
                input=json.dumps(obj), check=False,
            )  # fmt: skip

        def fenced() -> bool:  # the operator refused an object it does not manage
            return "dsv4-operator-fence" in dry_run(theirs, operator).stderr

        local.kubectl("apply", "--server-side", "-f", fence)
        wait_for("the fence in effect", fenced, 30)
        assert dry_run(pod).returncode == 0, dry_run(pod).stderr  # the admin is not fenced
        local.kubectl("delete", "-f", fence)
        wait_for("the fence gone", lambda: not fenced(), 30)
        assert dry_run(theirs, operator).returncode == 0  # RBAC alone lets it by
        local.kubectl("apply", "--server-side", "-f", fence)  # settings and all
        wait_for("the reinstalled fence", lambda: dry_run(pod).returncode != 0, 30)
        assert "no params found for policy binding" in dry_run(pod).stderr, dry_run(pod).stderr
        local.kubectl("get", "configmap", "dsv4-operator-settings", "-n", "dsv4-system")
    finally:
        local.down(log=lambda message: None)
