"""engine.yaml and the SGLang arguments it turns into (pure; the parser check is below)."""

import pytest
from pydantic import ValidationError

from dsv4_engine.engine_config import (
    EngineConfig,
    MultiNode,
    dump_engine_yaml,
    load_engine_yaml,
    owned_flag_in,
    place_pod,
    plugin_env,
    to_sglang_args,
)
from dsv4_engine.features import EngineFeatures, HiCacheFeature, IndexDtype, KvCanary, Role


def config(**kw):
    base = dict(role=Role.DECODE, model_path="/models", served_model_name="dsv4", tp=4)
    return EngineConfig(**{**base, **kw})


def value(args, flag):
    return args[args.index(flag) + 1]


def test_basic_args():
    args = to_sglang_args(config(features=EngineFeatures(kv_canary=KvCanary.OFF)))
    assert value(args, "--tp-size") == "4"
    assert value(args, "--disaggregation-mode") == "decode"
    assert value(args, "--tool-call-parser") == "deepseekv4"
    assert value(args, "--kv-canary") == "none"
    assert value(args, "--dp-size") == "1"
    assert "--enable-metrics" in args and "--enable-hierarchical-cache" not in args


def test_hicache_applies_only_to_its_roles_and_size_wins_over_ratio():
    hicache = HiCacheFeature(enabled=True, ratio=2.5, roles=(Role.PREFILL,))
    assert "--enable-hierarchical-cache" not in to_sglang_args(
        config(features=EngineFeatures(hicache=hicache))
    )
    args = to_sglang_args(config(role=Role.PREFILL, features=EngineFeatures(hicache=hicache)))
    assert value(args, "--hicache-ratio") == "2.5" and "--hicache-size" not in args
    sized = HiCacheFeature(enabled=True, ratio=2.5, size_gb=64)
    args = to_sglang_args(config(features=EngineFeatures(hicache=sized)))
    assert value(args, "--hicache-size") == "64" and "--hicache-ratio" not in args


def test_dp_attention_and_fp4_indexer():
    args = to_sglang_args(
        config(dp=4, enable_dp_attention=True, features=EngineFeatures(index_dtype=IndexDtype.FP4))
    )
    assert value(args, "--attn-dp-size") == "4" and "--dp-size" not in args
    assert "--enable-deepseek-v4-fp4-indexer" in args


# What LWS's pod webhook sets in a group's pods (lws pkg/utils/pod AddLWSVariables):
# `<lws>-<group>.<lws>.<namespace>` for the leader, the pod's worker index, the group size.
LWS_ENV = {"LWS_LEADER_ADDRESS": "f-prefill-2.f-prefill.ns", "LWS_GROUP_SIZE": "3"}


def test_multi_node_rank_and_rendezvous_come_from_the_lws_group():
    mn = MultiNode(nnodes=3)
    cfg = config(multinode=mn)
    with pytest.raises(ValueError, match="dist_init_addr"):
        to_sglang_args(cfg)
    placement = place_pod(mn, {**LWS_ENV, "LWS_WORKER_INDEX": "2"})
    assert placement.node_rank == 2
    assert placement.dist_init_addr == "f-prefill-2.f-prefill.ns:5000"
    args = to_sglang_args(cfg, placement.node_rank, placement.dist_init_addr)
    assert value(args, "--nnodes") == "3" and value(args, "--node-rank") == "2"
    leader = place_pod(mn, {**LWS_ENV, "LWS_WORKER_INDEX": "0"})
    assert (leader.node_rank, leader.dist_init_addr) == (0, "f-prefill-2.f-prefill.ns:5000")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "LWS_LEADER_ADDRESS, LWS_WORKER_INDEX, LWS_GROUP_SIZE not set"),
        ({**LWS_ENV, "LWS_WORKER_INDEX": "3"}, "LWS_WORKER_INDEX='3' is not a rank below 3"),
        (
            {**LWS_ENV, "LWS_WORKER_INDEX": "1", "LWS_GROUP_SIZE": "4"},
            "LWS_GROUP_SIZE='4', but the engine config has nnodes 3",
        ),
    ],
)
def test_a_pod_outside_a_matching_group_is_refused(env, message):
    with pytest.raises(ValueError, match=message):
        place_pod(MultiNode(nnodes=3), env)


def test_extra_args_cannot_set_owned_flags_even_abbreviated():
    assert owned_flag_in(["--tp", "8"]) == "--tp"
    assert owned_flag_in(["--port=1"]) == "--port=1"
    assert (
        owned_flag_in(["--mem-fraction-static", "0.8", "--enable-metrics-for-all-schedulers"])
        is None
    )
    with pytest.raises(ValidationError, match="operator owns"):
        config(extra_args=("--kv-canary", "raise"))


def test_extra_args_come_last_and_yaml_round_trips():
    cfg = config(extra_args=("--mem-fraction-static", "0.8"))
    assert to_sglang_args(cfg)[-2:] == ["--mem-fraction-static", "0.8"]
    text = dump_engine_yaml(cfg)
    assert load_engine_yaml(text) == cfg and dump_engine_yaml(load_engine_yaml(text)) == text


def test_bf16_index_k_reaches_the_plugin_not_sglang():
    cfg = config(features=EngineFeatures(index_dtype=IndexDtype.BF16))
    assert plugin_env(cfg) == {"DSV4_INDEX_DTYPE": "bf16"}
    assert "--enable-deepseek-v4-fp4-indexer" not in to_sglang_args(cfg)
