"""The fixed KV-pool configurator: index-K bytes per dtype and engine, pool sizes, the
legacy bug."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from dsv4_engine.configurator import (
    ConfigError,
    EngineSettings,
    GiB,
    compare_legacy,
    hicache_host_bytes,
    host_bytes_for_plan,
    index_k_bytes_per_token,
    load_hf_config,
    model_spec_from_hf_config,
    plan_for_gpu,
    plan_pools,
)
from dsv4_engine.configurator.index_budget import index_k_budget_bytes
from dsv4_engine.engine_config import Backend
from dsv4_engine.features import IndexDtype
from dsv4_engine.presets import preset_config

DSA_CONFIG = Path(__file__).parents[2] / "data" / "deepseek-v32-dsa-config.json"
BUDGET = 100 * GiB
# bf16 index-K is stored by the CPU reference engine only (SGLang stores fp8 or fp4).
REFERENCE = Backend.REFERENCE


@pytest.fixture(scope="module")
def flash():
    return model_spec_from_hf_config(preset_config("v4-flash"))


@pytest.fixture(scope="module")
def dsa():
    return model_spec_from_hf_config(load_hf_config(DSA_CONFIG))


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [("fp8", 128 + 4), ("fp4", 64 + 4), ("bf16", 256)],  # d + d/128*4, d/2 + d/32, 2d
)
def test_index_k_bytes(dtype, expected):
    assert index_k_bytes_per_token(IndexDtype(dtype), 128) == expected


@pytest.mark.parametrize(
    ("dtype", "legacy", "expected"),
    [
        ("bf16", True, 264),  # the seed's bug: fp8 formula x 2
        ("fp8", True, 132),  # the bug only bites bf16
        ("bf16", False, 256),
    ],
)
def test_index_k_budget_of_the_legacy_formula(dtype, legacy, expected):
    settings = EngineSettings(index_dtype=IndexDtype(dtype), engine=REFERENCE, legacy=legacy)
    assert index_k_budget_bytes(128, settings) == expected


def test_sglang_plans_refuse_bf16_index_k_naming_the_field(flash):
    with pytest.raises(ConfigError, match=r"^indexDtype bf16: SGLang 0\.5\.23 stores DeepSeek-V4 "):
        EngineSettings(index_dtype=IndexDtype.BF16)
    with pytest.raises(ConfigError, match="engine: expected one of sglang, reference"):
        EngineSettings(engine="vllm")


@pytest.mark.parametrize(
    ("engine", "dtype", "says"),
    [
        ("sglang", "fp8", "SGLang 0.5.23 stores 132 B (fp8 e4m3 keys + fp32 scale per 128)"),
        ("sglang", "fp4", "SGLang 0.5.23 stores 68 B (fp4 e2m1 keys + e8m0 scale per 32)"),
        ("reference", "bf16", "the CPU reference engine stores 256 B (bf16 keys, no scales)"),
    ],
)
def test_the_plan_says_which_engine_stores_what(flash, engine, dtype, says):
    plan = plan_pools(flash, EngineSettings(index_dtype=dtype, engine=engine), BUDGET)
    assert (plan.engine, plan.index_k_storage) == (engine, says)
    assert plan.to_dict()["index_k_storage"] == says


def test_presets_have_the_published_layer_mix(flash):
    assert (flash.num_layers, flash.layers_with_ratio(0), flash.layers_with_ratio(4)) == (43, 2, 21)
    assert flash.layers_with_ratio(128) == 20
    pro = model_spec_from_hf_config(preset_config("v4-pro"))
    assert pro.num_layers == 61 and pro.layers_with_ratio(0) == 0


@pytest.mark.parametrize(
    ("dtype", "engine"), [("fp8", "sglang"), ("fp4", "sglang"), ("bf16", "reference")]
)
def test_dsv4_plan_fills_the_budget_and_no_more(flash, dtype, engine):
    settings = EngineSettings(
        index_dtype=IndexDtype(dtype), engine=engine, max_running_requests=256
    )
    plan = plan_pools(flash, settings, BUDGET)
    used = plan.full_tokens * plan.bytes_per_full_token + plan.fixed_bytes
    one_more_page = used + settings.page_size * plan.bytes_per_full_token
    assert used <= BUDGET < one_more_page
    assert plan.full_tokens % settings.page_size == 0
    assert plan.pool("c4").tokens == plan.full_tokens // 4
    assert plan.pool("c128").tokens == plan.full_tokens // 128
    assert plan.pool("swa").tokens == int(plan.full_tokens * 0.1) // 256 * 256


def test_bf16_index_k_costs_its_real_size(flash):
    fp8 = plan_pools(flash, EngineSettings(index_dtype=IndexDtype.FP8), BUDGET)
    bf16 = plan_pools(flash, EngineSettings(index_dtype=IndexDtype.BF16, engine=REFERENCE), BUDGET)
    assert fp8.pool("c4_indexer").bytes_per_token == 21 * 132
    assert bf16.pool("c4_indexer").bytes_per_token == 21 * 256
    assert bf16.bytes_per_full_token - fp8.bytes_per_full_token == pytest.approx(
        21 * (256 - 132) / 4
    )
    assert bf16.full_tokens < fp8.full_tokens


def test_legacy_over_reserves_for_bf16_only(flash):
    settings = EngineSettings(
        index_dtype=IndexDtype.BF16, engine=REFERENCE, max_running_requests=512
    )
    cmp = compare_legacy(flash, settings, BUDGET)
    # 21 c4 layers x 8 extra bytes per compressed token / 4 full tokens per compressed one.
    assert cmp.legacy.bytes_per_full_token - cmp.fixed.bytes_per_full_token == pytest.approx(42)
    assert cmp.over_reserved_bytes == int(cmp.legacy.full_tokens * 42)
    assert cmp.tokens_lost > 0
    same = compare_legacy(flash, replace(settings, index_dtype=IndexDtype.FP8), BUDGET)
    assert same.tokens_lost == 0 and same.over_reserved_bytes == 0


def test_fp4_budgets_fp8_size_unless_exact(flash):
    sglang_way = plan_pools(flash, EngineSettings(index_dtype=IndexDtype.FP4), BUDGET)
    fp8 = plan_pools(flash, EngineSettings(index_dtype=IndexDtype.FP8), BUDGET)
    assert (sglang_way.index_k_budget_bytes, sglang_way.index_k_alloc_bytes) == (132, 68)
    assert sglang_way.full_tokens == fp8.full_tokens
    exact = plan_pools(
        flash, EngineSettings(index_dtype=IndexDtype.FP4, fp4_budget="exact"), BUDGET
    )
    assert exact.index_k_budget_bytes == 68 and exact.full_tokens > fp8.full_tokens


def test_max_running_requests_sets_the_c128_compress_state(flash):
    small = plan_pools(flash, EngineSettings(max_running_requests=64), BUDGET)
    large = plan_pools(flash, EngineSettings(max_running_requests=1024), BUDGET)
    # One 128-row ring per request slot (+1), 20 c128 layers of 2 x 512 fp32.
    assert large.fixed_bytes - small.fixed_bytes == (1024 - 64) * 128 * 20 * 2 * 512 * 4
    assert large.full_tokens < small.full_tokens
    assert large.pool("c128_state").tokens == 1025 * 128


def test_attention_dp_divides_max_running_requests(flash):
    plan = plan_pools(
        flash, EngineSettings(tp_size=8, dp_size=8, max_running_requests=1024), BUDGET
    )
    assert plan.max_running_requests_per_worker == 128


def test_swa_cap_mode_moves_swa_into_fixed_bytes():
    v41 = model_spec_from_hf_config({**preset_config("v4-flash"), "model_type": "deepseek_v41"})
    settings = EngineSettings(max_running_requests=64)
    assert plan_pools(v41, replace(settings, swa_full_tokens_ratio=0.1), BUDGET).swa_mode == "ratio"
    plan = plan_pools(v41, settings, BUDGET)
    assert plan.swa_mode == "cap"
    swa = plan.pool("swa").tokens
    assert swa % 256 == 0
    # 64 requests x (window 128 + eviction 128 + page 256 + decode page 256) + 2 chunks + a
    # page, plus 4 x 64 prefix tails of window + page, rounded up to a page.
    assert swa == -(-(64 * 768 + 2 * 8192 + 256 + 256 * 384) // 256) * 256
    assert plan.fixed_bytes > swa * plan.pool("swa").bytes_per_token


def test_speculative_decoding_reserves_the_draft_layer(flash):
    off = plan_pools(flash, EngineSettings(max_running_requests=64), BUDGET)
    on = plan_pools(
        flash, EngineSettings(max_running_requests=64, speculative_num_draft_tokens=4), BUDGET
    )
    assert on.pool("c4").bytes_per_token == pytest.approx(off.pool("c4").bytes_per_token * 44 / 43)
    with pytest.raises(ConfigError, match="speculative_num_draft_tokens"):
        plan_pools(flash, EngineSettings(speculative_num_draft_tokens=11), BUDGET)


def test_dsa_indexer_cell_size_per_dtype(dsa):
    fp8 = plan_pools(dsa, EngineSettings(page_size=64), BUDGET)
    # fp8 latent 512 + 4 scales x 4 B + bf16 rope 64 x 2 = 656 B, 61 layers; 132 B index-K.
    assert fp8.bytes_per_full_token == 61 * 656 + 61 * 132
    bf16_rows = EngineSettings(page_size=64, index_dtype=IndexDtype.BF16, engine=REFERENCE)
    bf16 = compare_legacy(dsa, bf16_rows, BUDGET)
    assert bf16.fixed.pool("indexer").bytes_per_token == 61 * 256
    assert bf16.legacy.pool("indexer").bytes_per_token == 61 * 264
    assert bf16.over_reserved_bytes == bf16.legacy.full_tokens * 61 * 8
    # fp4 keys are budgeted at the fp8 size, as for DeepSeek-V4, unless priced exactly.
    fp4 = plan_pools(dsa, EngineSettings(page_size=64, index_dtype=IndexDtype.FP4), BUDGET)
    assert fp4.bytes_per_full_token == fp8.bytes_per_full_token
    exact = EngineSettings(page_size=64, index_dtype=IndexDtype.FP4, fp4_budget="exact")
    assert plan_pools(dsa, exact, BUDGET).pool("indexer").bytes_per_token == 61 * 68


def test_hicache_host_bytes_follow_the_device_pages(flash):
    cfg = preset_config("v4-flash")
    settings = EngineSettings(index_dtype=IndexDtype.FP8, tp_size=4, max_running_requests=256)
    plan = plan_for_gpu(cfg, settings, 180 * GiB)
    two = host_bytes_for_plan(flash, settings, plan, 2.0)
    assert two == hicache_host_bytes(cfg, settings, gpu_memory_bytes=180 * GiB, ratio=2.0)
    pages = plan.full_tokens // 256
    bf16_settings = replace(settings, index_dtype=IndexDtype.BF16, engine=REFERENCE)
    # Same device pages, bf16 keys: each host page grows by 21 layers x 64 keys x 124 B.
    bf16_same_pages = host_bytes_for_plan(flash, bf16_settings, plan, 2.0)
    assert bf16_same_pages - two == 2 * pages * 21 * 64 * (256 - 132)
    four = host_bytes_for_plan(flash, settings, plan, 4.0)
    assert four == pytest.approx(2 * two, rel=1e-4)
    assert hicache_host_bytes(cfg, settings, gpu_memory_bytes=180 * GiB, size_gb=64) == 64 * GiB
    with pytest.raises(ConfigError, match="greater than 1"):
        host_bytes_for_plan(flash, settings, plan, 1.0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"architectures": ["LlamaForCausalLM"], "model_type": "llama"},
            "unknown model architecture 'LlamaForCausalLM'",
        ),
        ({"compress_ratios": [0, 4]}, "compress_ratios"),
        ({"num_hidden_layers": "many"}, "num_hidden_layers"),
    ],
)
def test_bad_model_configs_are_named(change, message):
    with pytest.raises(ConfigError, match=message):
        model_spec_from_hf_config({**preset_config("v4-flash"), **change})


def test_bad_settings_and_budgets_are_named(flash, tmp_path):
    with pytest.raises(ConfigError, match="page_size.*multiple of 128"):
        plan_pools(flash, EngineSettings(page_size=192), BUDGET)
    with pytest.raises(ConfigError, match="too small for one request"):
        plan_pools(flash, EngineSettings(), 64 * 1024 * 1024)
    with pytest.raises(ConfigError, match="index_dtype"):
        EngineSettings(index_dtype="int8")
    with pytest.raises(ConfigError, match="file not found"):
        load_hf_config(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_hf_config(tmp_path / "bad.json")
    with pytest.raises(ConfigError, match="does not cover the weights"):
        plan_for_gpu(preset_config("v4-flash"), EngineSettings(), 8 * GiB)


def test_configurator_never_imports_torch():
    code = (
        "import sys, dsv4_engine.configurator, dsv4_engine.presets\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_preset_files_are_the_published_configs():
    shared = Path("/work/shared/models/deepseek-v4-flash/config.json")
    if not shared.exists():
        pytest.skip("the shared model directory is only on the development machine")
    assert preset_config("v4-flash") == json.loads(shared.read_text())
