"""The rendered arguments against SGLang 0.5.23's own parser (real import, no copy)."""

import argparse

import pytest

from dsv4_engine.engine_config import (
    OPERATOR_OWNED_FLAGS,
    UNTRACKED_INPUT_FLAGS,
    UNTRACKED_PREFIXES_OF_THEIR_OWN,
    Disaggregation,
    EngineConfig,
    MultiNode,
    place_pod,
    to_sglang_args,
    untracked_flag_in,
)
from dsv4_engine.features import EngineFeatures, HiCacheFeature, IndexDtype, KvCanary, Role

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def parser():
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    return parser


def full_config():
    return EngineConfig(
        role=Role.PREFILL,
        model_path="/models/flash",
        served_model_name="deepseek-v4-flash",
        tp=16,
        dp=4,
        ep=8,
        enable_dp_attention=True,
        multinode=MultiNode(nnodes=2),
        disaggregation=Disaggregation(transfer_backend="nixl", ib_devices=("mlx5_0", "mlx5_1")),
        features=EngineFeatures(
            hicache=HiCacheFeature(
                enabled=True, ratio=2.0, write_policy="write_back", mem_layout="page_first_direct"
            ),
            index_dtype=IndexDtype.FP4,
            kv_canary=KvCanary.RAISE,
        ),
        extra_args=("--mem-fraction-static", "0.82"),
    )


def test_every_rendered_flag_parses_to_the_intended_value(parser):
    cfg = full_config()
    lws_env = {
        "LWS_LEADER_ADDRESS": "f-prefill-0.f-prefill.ns",
        "LWS_WORKER_INDEX": "1",
        "LWS_GROUP_SIZE": "2",
    }
    placement = place_pod(cfg.multinode, lws_env)
    ns = parser.parse_args(to_sglang_args(cfg, placement.node_rank, placement.dist_init_addr))
    assert ns.model_path == "/models/flash"
    assert ns.served_model_name == "deepseek-v4-flash"
    assert ns.tool_call_parser == "deepseekv4"
    assert (ns.tp_size, ns.attn_dp_size, ns.ep_size) == (16, 4, 8)
    assert (ns.nnodes, ns.node_rank) == (2, 1)
    assert ns.dist_init_addr == "f-prefill-0.f-prefill.ns:5000"
    assert ns.disaggregation_mode == "prefill"
    assert ns.disaggregation_transfer_backend == "nixl"
    assert ns.disaggregation_ib_device == "mlx5_0,mlx5_1"
    assert ns.disaggregation_bootstrap_port == 8998
    assert ns.enable_hierarchical_cache is True and ns.hicache_ratio == 2.0
    assert ns.hicache_write_policy == "write_back"
    assert ns.hicache_mem_layout == "page_first_direct"
    assert ns.kv_canary == "raise" and ns.enable_metrics is True
    assert ns.enable_deepseek_v4_fp4_indexer is True
    assert (ns.host, ns.port) == ("0.0.0.0", 30000)
    assert ns.mem_fraction_static == 0.82


def test_plain_decode_parses(parser):
    cfg = EngineConfig(
        role=Role.DECODE,
        model_path="/models",
        served_model_name="m",
        tp=4,
        features=EngineFeatures(hicache=HiCacheFeature(enabled=True, size_gb=64)),
    )
    ns = parser.parse_args(to_sglang_args(cfg))
    assert (ns.tp_size, ns.dp_size, ns.disaggregation_mode) == (4, 1, "decode")
    assert ns.hicache_size == 64 and ns.kv_canary == "none"


def test_owned_flags_cover_every_alias_of_what_they_set(parser):
    actions = parser._option_string_actions
    for flag in OPERATOR_OWNED_FLAGS:
        assert flag in actions, f"{flag} is not a SGLang 0.5.23 flag"
        for alias in actions[flag].option_strings:
            assert alias in OPERATOR_OWNED_FLAGS, f"{alias} (alias of {flag}) is not owned"


def test_untracked_input_flags_are_sglangs_with_every_alias(parser):
    """Each refused flag is a SGLang 0.5.23 option, and so is each alias of it; the options
    that merely begin a refused flag's name are exactly the ones that are not refused."""
    actions = parser._option_string_actions
    for flag in UNTRACKED_INPUT_FLAGS:
        assert flag in actions, f"{flag} is not a SGLang 0.5.23 flag"
        for alias in actions[flag].option_strings:
            assert alias in UNTRACKED_INPUT_FLAGS, f"{alias} (alias of {flag}) is not refused"
    listed = set(UNTRACKED_INPUT_FLAGS) | set(OPERATOR_OWNED_FLAGS)
    prefixes = {
        option
        for option in actions
        if option.startswith("--")
        and option not in listed
        and any(f.startswith(option) and f != option for f in UNTRACKED_INPUT_FLAGS)
    }
    assert prefixes == set(UNTRACKED_PREFIXES_OF_THEIR_OWN)
    # argparse itself takes such an option exactly, not as an abbreviation of the refused one.
    model = ["--model-path", "/models"]
    known, _ = parser.parse_known_args([*model, "--hicache-storage-backend", "file"])
    assert (
        known.hicache_storage_backend == "file" and not known.hicache_storage_backend_extra_config
    )
    assert untracked_flag_in(["--hicache-storage-backend", "file"]) is None
    assert untracked_flag_in(["--conf", "x.yaml"]) == "--conf"  # argparse: --config
    assert parser.parse_known_args([*model, "--conf", "x.yaml"])[0].config == "x.yaml"
