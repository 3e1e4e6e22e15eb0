"""Rendering a spec into children: placement, config hashes, what a change touches."""

import yaml

from dsv4_engine.engine_config import load_engine_yaml
from dsv4_engine.features import Role
from dsv4_operator.api.samples import load_sample, merge_patch
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.render import render_all
from dsv4_operator.render.engine import short_hash
from dsv4_operator.render.meta import ANNOTATION_CONFIG_HASH, LABEL_COMPONENT, Owner

OWNER = Owner(name="flash", namespace="serving", uid="uid-1")


def render(patch=None, host_memory=None):
    spec = DSV4DeploymentSpec.model_validate(merge_patch(load_sample()["spec"], patch or {}))
    kwargs = {"host_memory": host_memory} if host_memory else {}
    return {(o["kind"], o["metadata"]["name"]): o for o in render_all(OWNER, spec, **kwargs)}


def pod_spec(objs, name):
    return objs[("StatefulSet", name)]["spec"]["template"]["spec"]


def test_sample_renders_every_child_owned_by_the_deployment():
    objs = render()
    assert set(objs) == {
        ("ConfigMap", "flash-engine"),
        ("StatefulSet", "flash-prefill"),
        ("StatefulSet", "flash-decode"),
        ("Service", "flash-prefill"),
        ("Service", "flash-decode"),
        ("PodDisruptionBudget", "flash-prefill"),
        ("PodDisruptionBudget", "flash-decode"),
        ("Deployment", "flash-router"),
        ("Service", "flash-router"),
        ("ServiceAccount", "flash-router"),
        ("RoleBinding", "flash-router-discovery"),
        ("NetworkPolicy", "flash-engines"),
    }
    for obj in objs.values():
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref["uid"] == "uid-1" and ref["controller"] is True
        assert obj["metadata"]["namespace"] == "serving"
    assert objs[("Service", "flash-decode")]["spec"]["clusterIP"] == "None"


def test_gpu_placement():
    spec = pod_spec(render(), "flash-decode")
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"] == [
        {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-B200"]}
    ]
    (anti,) = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    assert anti["labelSelector"]["matchLabels"][LABEL_COMPONENT] == "decode"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    (engine,) = spec["containers"]
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert engine["command"] == ["dsv4-engine", "launch", "--config", "/etc/dsv4/engine.yaml"]
    assert "topologySpreadConstraints" not in spec
    spread = pod_spec(
        render({"placement": {"topologyKey": "nvidia.com/gpu.clique"}}), "flash-decode"
    )
    assert spread["topologySpreadConstraints"][0]["topologyKey"] == "nvidia.com/gpu.clique"


def test_pod_templates_carry_the_hash_of_their_roles_engine_yaml():
    objs = render()
    data = objs[("ConfigMap", "flash-engine")]["data"]
    for role in Role:
        template = objs[("StatefulSet", f"flash-{role.value}")]["spec"]["template"]
        assert template["metadata"]["annotations"][ANNOTATION_CONFIG_HASH] == short_hash(
            data[f"{role.value}.yaml"]
        )
        assert load_engine_yaml(data[f"{role.value}.yaml"]).role is role


def test_flag_change_rolls_only_the_roles_it_affects():
    before = render()
    after = render({"features": {"hicache": {"enabled": True, "ratio": 2.0, "roles": ["decode"]}}})
    changed = {k for k in before if before[k] != after[k]}
    assert changed == {("ConfigMap", "flash-engine"), ("StatefulSet", "flash-decode")}
    # Another index-K dtype is another transfer format: both roles, and the router, which
    # discovers only engines of its own format (a paired promotion never mixes them).
    both = render({"features": {"indexDtype": "fp4"}})
    assert {k for k in before if before[k] != both[k]} == {
        ("ConfigMap", "flash-engine"),
        ("StatefulSet", "flash-decode"),
        ("StatefulSet", "flash-prefill"),
        ("Deployment", "flash-router"),
    }


def test_decode_replicas_change_touches_only_the_decode_statefulset():
    before, after = render(), render({"decode": {"replicas": 3}})
    assert {k for k in before if before[k] != after[k]} == {("StatefulSet", "flash-decode")}
    assert after[("StatefulSet", "flash-decode")]["spec"]["replicas"] == 3


def test_multi_node_replicas_get_leaders_workers_and_a_rendezvous():
    objs = render({"prefill": {"replicas": 2, "nodesPerReplica": 3, "gpusPerNode": 8, "tp": 24}})
    leaders = objs[("StatefulSet", "flash-prefill")]
    workers = objs[("StatefulSet", "flash-prefill-workers")]
    assert leaders["spec"]["replicas"] == 2 and workers["spec"]["replicas"] == 4
    assert leaders["spec"]["serviceName"] == workers["spec"]["serviceName"] == "flash-prefill"
    assert objs[("PodDisruptionBudget", "flash-prefill")]["spec"]["maxUnavailable"] == 3
    config = load_engine_yaml(objs[("ConfigMap", "flash-engine")]["data"]["prefill.yaml"])
    assert config.multinode is not None and config.multinode.nnodes == 3
    assert config.multinode.leader_stateful_set == "flash-prefill"
    worker_ports = workers["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert [p["name"] for p in worker_ports] == ["dist"]


def test_router_discovers_leaders_by_label_and_uses_the_policy():
    objs = render({"router": {"policy": "round_robin", "replicas": 2}})
    router = objs[("Deployment", "flash-router")]
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--pd-disaggregation" in args and "--service-discovery" in args
    assert args[args.index("--policy") + 1] == "round_robin"
    assert "app.kubernetes.io/component=prefill" in args
    assert "inference.dsv4.dev/group-role=leader" in args
    assert router["spec"]["replicas"] == 2
    assert objs[("Service", "flash-router")]["spec"]["type"] == "ClusterIP"


def test_model_from_a_pvc_and_the_host_memory_seam():
    objs = render(
        {"model": {"hostPath": None, "pvc": {"claimName": "weights", "path": "v4/flash"}}},
        host_memory=lambda spec, role: "300Gi" if role is Role.DECODE else "100Gi",
    )
    spec = pod_spec(objs, "flash-decode")
    (model,) = [v for v in spec["volumes"] if v["name"] == "model"]
    assert model["persistentVolumeClaim"] == {"claimName": "weights", "readOnly": True}
    assert spec["containers"][0]["resources"]["requests"]["memory"] == "300Gi"
    data = yaml.safe_load(objs[("ConfigMap", "flash-engine")]["data"]["decode.yaml"])
    assert data["modelPath"] == "/models/v4/flash"
