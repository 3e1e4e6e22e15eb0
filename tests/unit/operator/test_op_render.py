"""Rendering a spec into children: placement, config hashes, what a change touches."""

import yaml

from dsv4_engine.engine_config import dump_engine_yaml, load_engine_yaml
from dsv4_engine.features import Role
from dsv4_operator.api.samples import load_sample, merge_patch
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.render import engine as rendered
from dsv4_operator.render import render_all
from dsv4_operator.render.engine import engine_config, short_hash
from dsv4_operator.render.meta import ANNOTATION_CONFIG_HASH, LABEL_COMPONENT, Owner

OWNER = Owner(name="flash", namespace="serving", uid="uid-1")


def render(patch=None, host_memory=None):
    spec = DSV4DeploymentSpec.model_validate(merge_patch(load_sample()["spec"], patch or {}))
    kwargs = {"host_memory": host_memory} if host_memory else {}
    return {key(o): o for o in render_all(OWNER, spec, **kwargs)}


def key(obj):
    """(kind, name); an engine ConfigMap by its role (its name ends in its content's hash)."""
    if obj["kind"] == "ConfigMap":
        (item,) = obj["data"]
        return ("ConfigMap", f"{item.removesuffix('.yaml')}.yaml")
    return (obj["kind"], obj["metadata"]["name"])


def engine_yaml(objs, role):
    return objs[("ConfigMap", f"{role.value}.yaml")]["data"][f"{role.value}.yaml"]


def pod_spec(objs, name):
    return objs[("StatefulSet", name)]["spec"]["template"]["spec"]


def test_sample_renders_every_child_owned_by_the_deployment():
    objs = render()
    assert set(objs) == {
        ("ConfigMap", "prefill.yaml"),
        ("ConfigMap", "decode.yaml"),
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
        ("PodDisruptionBudget", "flash-router"),
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
    for role in Role:
        text = engine_yaml(objs, role)
        template = objs[("StatefulSet", f"flash-{role.value}")]["spec"]["template"]
        assert template["metadata"]["annotations"][ANNOTATION_CONFIG_HASH] == short_hash(text)
        assert load_engine_yaml(text).role is role
        # Its own immutable ConfigMap, named for its content: a restarted pod of an older
        # template still mounts the configuration it was created with.
        config_map = objs[("ConfigMap", f"{role.value}.yaml")]
        assert config_map["immutable"] is True
        assert (
            config_map["metadata"]["name"] == f"flash-{role.value}-engine-{short_hash(text)[:10]}"
        )
        (volume,) = [v for v in template["spec"]["volumes"] if v["name"] == "engine-config"]
        assert volume["configMap"]["name"] == config_map["metadata"]["name"]


def test_flag_change_rolls_only_the_roles_it_affects():
    before = render()
    after = render({"features": {"hicache": {"enabled": True, "ratio": 2.0, "roles": ["decode"]}}})
    changed = {k for k in before if before[k] != after[k]}
    assert changed == {("ConfigMap", "decode.yaml"), ("StatefulSet", "flash-decode")}
    # Another index-K dtype is another transfer format: both roles, and the router, which
    # discovers only engines of its own format (a paired promotion never mixes them).
    both = render({"features": {"indexDtype": "fp4"}})
    assert {k for k in before if before[k] != both[k]} == {
        ("ConfigMap", "prefill.yaml"),
        ("ConfigMap", "decode.yaml"),
        ("StatefulSet", "flash-decode"),
        ("StatefulSet", "flash-prefill"),
        ("Deployment", "flash-router"),
    }


def test_decode_replicas_change_touches_only_the_decode_statefulset():
    before, after = render(), render({"decode": {"replicas": 3}})
    assert {k for k in before if before[k] != after[k]} == {("StatefulSet", "flash-decode")}
    assert after[("StatefulSet", "flash-decode")]["spec"]["replicas"] == 3


def test_a_multi_node_role_is_one_leaderworkerset_group_per_replica():
    objs = render({"prefill": {"replicas": 2, "nodesPerReplica": 3, "gpusPerNode": 8, "tp": 24}})
    lws = objs[("LeaderWorkerSet", "flash-prefill")]
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert lws["spec"]["replicas"] == 2
    group = lws["spec"]["leaderWorkerTemplate"]
    assert group["size"] == 3 and group["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert lws["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"] == {
        "maxUnavailable": 1,
        "maxSurge": 0,
    }
    # No StatefulSet or Service of ours for it: LWS makes its sets and the headless Service.
    assert ("StatefulSet", "flash-prefill") not in objs
    assert ("Service", "flash-prefill") not in objs
    assert ("StatefulSet", "flash-decode") in objs  # the single-node role stays a StatefulSet
    assert objs[("PodDisruptionBudget", "flash-prefill")]["spec"]["maxUnavailable"] == 3
    leader, worker = group["leaderTemplate"], group["workerTemplate"]
    assert leader["metadata"]["labels"]["inference.dsv4.dev/group-role"] == "leader"
    assert worker["metadata"]["labels"]["inference.dsv4.dev/group-role"] == "worker"
    hashes = {t["metadata"]["annotations"][ANNOTATION_CONFIG_HASH] for t in (leader, worker)}
    assert len(hashes) == 1  # one engine.yaml for the whole group
    (leader_c,), (worker_c,) = leader["spec"]["containers"], worker["spec"]["containers"]
    assert [p["name"] for p in worker_c["ports"]] == ["dist"]
    assert "readinessProbe" in leader_c and "readinessProbe" not in worker_c
    config = load_engine_yaml(engine_yaml(objs, Role.PREFILL))
    assert config.multinode is not None and config.multinode.nnodes == 3


def test_with_a_topology_key_a_groups_pods_share_one_domain():
    """Pod affinity on the NVLink-domain label, per group: `matchLabelKeys` takes the
    incoming pod's own LWS group key, so one template holds every group together (the e2e
    test shows the scheduler doing it); single-node roles get no such term."""
    topology = {"placement": {"topologyKey": "nvidia.com/gpu.clique"}}
    objs = render({**topology, "decode": {"nodesPerReplica": 2, "gpusPerNode": 8, "tp": 16}})
    group = objs[("LeaderWorkerSet", "flash-decode")]["spec"]["leaderWorkerTemplate"]
    for template in (group["leaderTemplate"], group["workerTemplate"]):
        (term,) = template["spec"]["affinity"]["podAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        assert term["topologyKey"] == "nvidia.com/gpu.clique"
        assert term["matchLabelKeys"] == ["leaderworkerset.sigs.k8s.io/group-key"]
        assert term["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "decode"
    assert "podAffinity" not in pod_spec(objs, "flash-prefill")["affinity"]
    no_key = render({"decode": {"nodesPerReplica": 2, "gpusPerNode": 8, "tp": 16}})
    group = no_key[("LeaderWorkerSet", "flash-decode")]["spec"]["leaderWorkerTemplate"]
    assert "podAffinity" not in group["leaderTemplate"]["spec"]["affinity"]


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
    data = yaml.safe_load(engine_yaml(objs, Role.DECODE))
    assert data["modelPath"] == "/models/v4/flash"


def test_the_reference_model_reaches_each_roles_engine_yaml():
    """spec.model.referenceModel is what the reference engine of every role builds."""
    objs = render({"engine": "reference", "model": {"referenceModel": "echo"}})
    assert {load_engine_yaml(engine_yaml(objs, r)).reference_model.value for r in Role} == {"echo"}
    default = render({"engine": "reference"})
    assert load_engine_yaml(engine_yaml(default, Role.DECODE)).reference_model.value == "random"


def _empty_lists(value, path=""):
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _empty_lists(v, f"{path}/{k}")]
    if isinstance(value, list):
        inner = [p for i, v in enumerate(value) for p in _empty_lists(v, f"{path}[{i}]")]
        return inner if value else [path]
    return []


def test_no_child_holds_an_empty_list_the_api_server_would_drop():
    """The API server stores no empty list (every list field is omitempty), so a child
    rendering one would never be a subset of its live object: re-applied as drifted on every
    pass, never Ready.  (An empty map such as a NetworkPolicy's `namespaceSelector: {}` is
    kept: it means "all".)"""
    for (kind, name), obj in render().items():
        assert not _empty_lists(obj), f"{kind}/{name}: {_empty_lists(obj)}"


def test_engine_yaml_is_rendered_once_per_spec_and_equal_to_a_fresh_render():
    spec = DSV4DeploymentSpec.model_validate(load_sample()["spec"])
    edited = DSV4DeploymentSpec.model_validate(
        merge_patch(load_sample()["spec"], {"features": {"hicache": {"enabled": True, "ratio": 2}}})
    )
    for role in Role:
        assert rendered.engine_yaml(spec, role) == dump_engine_yaml(engine_config(spec, role))
        assert rendered.engine_yaml(spec, role) is rendered.engine_yaml(
            spec, role
        )  # the same text, kept
        assert rendered.engine_yaml(edited, role) == dump_engine_yaml(engine_config(edited, role))
        assert rendered.engine_yaml(edited, role) != rendered.engine_yaml(spec, role)
