"""HiCache changes resources: engine pods grow by the host tier the configurator computes."""

from __future__ import annotations

import pytest
from kubernetes.utils import parse_quantity

from dsv4_engine.configurator import EngineSettings, plan_for_gpu
from dsv4_engine.features import Role
from dsv4_engine.presets import preset_config
from dsv4_operator.api.rollout import CanarySpec
from dsv4_operator.api.samples import load_sample, merge_patch
from dsv4_operator.api.spec import DSV4DeploymentSpec, ModelPreset
from dsv4_operator.render import render_all
from dsv4_operator.render.memory import GIB, MemorySizingError, pod_memory
from dsv4_operator.render.meta import Owner
from dsv4_operator.rollout.slices import canary_owner, canary_spec, spec_revision

OWNER = Owner(name="flash", namespace="prod", uid="u-1")


def spec(features: dict | None = None) -> DSV4DeploymentSpec:
    raw = load_sample()["spec"]
    return DSV4DeploymentSpec.model_validate(merge_patch(raw, {"features": features or {}}))


def engine_memory(objects: list[dict], role: Role) -> int:
    (sts,) = [
        o
        for o in objects
        if o["kind"] == "StatefulSet"
        and o["metadata"]["labels"]["app.kubernetes.io/component"] == role.value
    ]
    container = sts["spec"]["template"]["spec"]["containers"][0]
    requests, limits = container["resources"]["requests"], container["resources"]["limits"]
    assert requests["memory"] == limits["memory"]
    return int(parse_quantity(requests["memory"]))


def test_without_hicache_pods_ask_for_what_the_user_asked():
    s = spec()
    assert pod_memory(s, Role.DECODE) == s.decode.resources.memory


def test_hicache_adds_ratio_times_the_device_kv_pools_of_every_gpu_in_the_pod():
    s = spec({"hicache": {"enabled": True, "ratio": 2.0, "roles": ["decode"]}})
    objects = render_all(OWNER, s)
    requested = int(parse_quantity(s.decode.resources.memory))
    added = engine_memory(objects, Role.DECODE) - requested
    device = plan_for_gpu(
        preset_config("v4-flash"),
        EngineSettings(tp_size=s.decode.tp, disaggregation_mode="decode"),
        180 * GIB,
    )
    device_kv_bytes = device.kv_budget_bytes * s.decode.gpus_per_node
    # The host tier mirrors the device pools at 2x: within a page-rounding margin of 2x.
    assert 1.9 * device_kv_bytes < added < 2.1 * device_kv_bytes
    assert engine_memory(objects, Role.PREFILL) == int(parse_quantity(s.prefill.resources.memory))


def test_the_canary_asks_for_the_same_memory_as_the_promoted_pods_will():
    # HiCache with the fp4 indexer is a known issue: acknowledged, as a user running it would.
    fp4 = {"hicache": {"enabled": True, "ratio": 3.0}, "indexDtype": "fp4"}
    ack = ["sglang-35811-hicache-fp4-indexer"]
    raw = merge_patch(load_sample()["spec"], {"features": fp4, "acknowledgedKnownIssues": ack})
    new = DSV4DeploymentSpec.model_validate(raw)
    stable = spec()
    flags = spec_revision(new)
    canary = render_all(canary_owner(OWNER), canary_spec(stable, flags, CanarySpec()))
    promoted = render_all(OWNER, new)
    assert spec_revision(new) == flags
    for role in Role:
        assert engine_memory(canary, role) == engine_memory(promoted, role)
        assert engine_memory(promoted, role) > int(parse_quantity(stable.decode.resources.memory))


def test_the_model_preset_sizes_the_tier_and_a_model_too_big_for_the_gpus_is_refused():
    eight = {"gpusPerNode": 8, "tp": 8}
    raw = merge_patch(load_sample()["spec"], {"decode": eight, "prefill": eight})
    flash = DSV4DeploymentSpec.model_validate(
        merge_patch(raw, {"features": {"hicache": {"enabled": True, "ratio": 2.0}}})
    )
    pro = flash.model_copy(
        update={"model": flash.model.model_copy(update={"preset": ModelPreset.V4_PRO})}
    )
    flash_bytes = int(parse_quantity(pod_memory(flash, Role.DECODE)))
    pro_bytes = int(parse_quantity(pod_memory(pro, Role.DECODE)))
    assert pro_bytes != flash_bytes
    # V4-Pro's weights do not fit 4 B200s per replica: a clear error, not a wrong request.
    pro_on_four = spec({"hicache": {"enabled": True, "ratio": 2.0}})
    pro_on_four = pro_on_four.model_copy(
        update={"model": pro_on_four.model.model_copy(update={"preset": ModelPreset.V4_PRO})}
    )
    with pytest.raises(MemorySizingError, match="does not cover the weights"):
        pod_memory(pro_on_four, Role.DECODE)


def test_an_impossible_sizing_names_the_field(monkeypatch):
    import dsv4_operator.render.memory as memory

    s = spec({"hicache": {"enabled": True, "ratio": 2.0}})
    unknown_gpu = s.placement.model_copy(update={"gpu_products": ("NVIDIA-T4",)})
    monkeypatch.setattr(memory, "DEFAULT_GPU_MEMORY_BYTES", 1 * GIB)  # too small for one page
    with pytest.raises(MemorySizingError, match=r"spec\.features\.hicache \(decode\)"):
        pod_memory(s.model_copy(update={"placement": unknown_gpu}), Role.DECODE)


def test_hicache_ratio_4_makes_a_decode_pod_too_big_for_a_2_tib_node():
    """What tests/e2e/test_stuck.py and docs/rollout.md rely on: at ratio 4 the B200 sample's
    decode pod asks for 2.06 TiB, more than the local cluster's 2 TiB nodes; at 2 it fits."""

    def decode(ratio: float) -> float:
        hicache = {"hicache": {"enabled": True, "ratio": ratio, "roles": ["decode"]}}
        return int(parse_quantity(pod_memory(spec(hicache), Role.DECODE))) / (1 << 40)

    assert round(decode(4), 2) == 2.06 and decode(2) < 2
