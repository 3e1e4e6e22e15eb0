"""The local runtime runs exactly the flags the operator rendered; only what cannot run on a
CPU (parallelism, SGLang-only tuning) and the address it binds (the pod's IP) change: the
ports stay the rendered ones, each pod having its own IP."""

from __future__ import annotations

import pytest
import yaml

from dsv4_dev.localrun.runtime import NotReference, local_engine_yaml
from dsv4_engine.commands.launch import UNGATED_INDEX_K_ENV
from dsv4_engine.engine_config import Backend, EngineConfig, dump_engine_yaml, load_engine_yaml
from dsv4_engine.features import EngineFeatures, FaultInjection, HiCacheFeature, IndexDtype, Role


def rendered(features: EngineFeatures, backend: Backend = Backend.REFERENCE) -> str:
    config = EngineConfig(
        role=Role.DECODE,
        backend=backend,
        model_path="/models",
        served_model_name="deepseek-v4-flash",
        tp=4,
        ep=2,
        features=features,
        extra_args=("--mem-fraction-static", "0.8"),
    )
    return dump_engine_yaml(config)


def test_flags_are_kept_and_cpu_only_fields_are_replaced():
    features = EngineFeatures(
        hicache=HiCacheFeature(enabled=True, ratio=2.0), index_dtype=IndexDtype.BF16
    )
    text, env = local_engine_yaml(rendered(features), "127.3.128.7")
    local = load_engine_yaml(text)
    assert local.features == features
    assert local.role is Role.DECODE
    assert (local.backend, local.tp, local.ep, local.port) == (Backend.REFERENCE, 1, 1, 30000)
    assert local.host == "127.3.128.7" and local.disaggregation.bootstrap_port == 8998
    assert local.extra_args == ()  # SGLang-only tuning has no meaning for the CPU engine
    assert env == {}
    assert yaml.safe_load(text)["features"]["indexDtype"] == "bf16"


def test_the_demo_fault_reaches_the_engine_as_its_environment_switch():
    features = EngineFeatures(fault_injection=FaultInjection(ungated_index_k=True))
    _, env = local_engine_yaml(rendered(features), "127.3.128.7")
    assert env == {UNGATED_INDEX_K_ENV: "1"}
    aimed = EngineFeatures(fault_injection=FaultInjection(ungated_index_k=True, ungated_share=0.15))
    _, env = local_engine_yaml(rendered(aimed), "127.3.128.7")
    assert env == {UNGATED_INDEX_K_ENV: "0.15"}


def test_an_sglang_pod_is_never_swapped_for_the_reference_engine():
    """What a DSV4Deployment says it runs is what runs: SGLang needs GPUs, so the local
    runtime leaves such a pod alone rather than quietly running something else."""
    with pytest.raises(NotReference, match="only `spec.engine: reference`"):
        local_engine_yaml(rendered(EngineFeatures(), Backend.SGLANG), "127.3.128.7")
