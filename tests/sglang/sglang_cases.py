"""Case descriptions for the SGLang tests: each becomes SGLang server arguments and the
configurator's settings, so both sides size exactly the same thing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dsv4_engine.configurator import (
    EngineSettings,
    PoolPlan,
    load_hf_config,
    model_spec_from_hf_config,
    plan_pools,
)
from dsv4_engine.engine_config import Backend
from dsv4_engine.features import IndexDtype
from dsv4_engine.presets import preset_config

DSA_CONFIG = Path(__file__).parents[1] / "data" / "deepseek-v32-dsa-config.json"
MODELS = {
    "flash": lambda: preset_config("v4-flash"),
    "pro": lambda: preset_config("v4-pro"),
    "v32": lambda: load_hf_config(DSA_CONFIG),
    # The model type SGLang leaves the SWA ratio unset for: its SWA pool is sized from the
    # request cap.  V4-Flash's dimensions.
    "v41": lambda: {**preset_config("v4-flash"), "model_type": "deepseek_v41"},
}


def sglang_args(case: dict[str, Any]) -> dict[str, Any]:
    """SGLang server arguments for a case description (see `our_settings`)."""
    args: dict[str, Any] = {"chunked_prefill_size": 8192, "tp_size": case.get("tp", 1)}
    if case.get("dp", 1) > 1:
        args |= {"dp_size": case["dp"], "enable_dp_attention": True}
    if "mrr" in case:
        args["max_running_requests"] = case["mrr"]
    if "swa" in case:
        args["swa_full_tokens_ratio"] = case["swa"]
    if "spec" in case:
        drafts, steps = case["spec"]
        args |= {
            "speculative_algorithm": "EAGLE",
            "speculative_num_steps": steps,
            "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": drafts,
        }
    if "mode" in case:
        args["disaggregation_mode"] = case["mode"]
        args["disaggregation_decode_extra_slots"] = case.get("extra", 0)
    if "kv" in case:
        args["kv_cache_dtype"] = case["kv"]
    return args


def our_settings(case: dict[str, Any]) -> EngineSettings:
    drafts, steps = case.get("spec", (0, 0))
    return EngineSettings(
        index_dtype=IndexDtype(case.get("index_dtype", "fp8")),
        engine=Backend(case.get("engine", "sglang")),
        legacy=case.get("legacy", False),
        page_size=case.get("page", 256),
        tp_size=case.get("tp", 1),
        dp_size=case.get("dp", 1),
        swa_full_tokens_ratio=case.get("swa"),
        max_running_requests=case.get("mrr"),
        speculative_num_draft_tokens=drafts,
        speculative_num_steps=steps,
        disaggregation_mode=case.get("mode", "null"),
        disaggregation_decode_extra_slots=case.get("extra", 0),
        kv_cache_dtype=case.get("kv", "fp8_e4m3"),
    )


def our_plan(case: dict[str, Any]) -> PoolPlan:
    model = model_spec_from_hf_config(MODELS[case["model"]]())
    return plan_pools(model, our_settings(case), case["budget"])


# With the fp8 index-K, each must size exactly as SGLang does.
GB = 10**9
PARITY_CASES = [
    {"id": "flash-default", "model": "flash", "budget": 100 * GB},
    {"id": "flash-tp4", "model": "flash", "tp": 4, "budget": 126 * 2**30},
    {"id": "flash-tp8-dp8", "model": "flash", "tp": 8, "dp": 8, "mrr": 1024, "budget": 100 * GB},
    {"id": "flash-tp4-dp4", "model": "flash", "tp": 4, "dp": 4, "mrr": 256, "budget": 40 * GB},
    {"id": "flash-mrr16", "model": "flash", "mrr": 16, "budget": 30 * GB},
    {"id": "flash-swa0.05", "model": "flash", "mrr": 64, "swa": 0.05, "budget": 60 * GB},
    {"id": "flash-swa0.3", "model": "flash", "mrr": 512, "swa": 0.3, "budget": 150 * GB},
    {"id": "flash-page128", "model": "flash", "page": 128, "budget": 80 * GB},
    {"id": "flash-page512", "model": "flash", "page": 512, "budget": 80 * GB},
    {"id": "flash-mtp4", "model": "flash", "spec": (4, 3), "budget": 100 * GB},
    {"id": "flash-mtp2", "model": "flash", "spec": (2, 1), "mrr": 128, "budget": 50 * GB},
    {"id": "flash-decode", "model": "flash", "mode": "decode", "extra": 8, "budget": 100 * GB},
    {"id": "flash-prefill", "model": "flash", "mode": "prefill", "budget": 90 * GB},
    {"id": "flash-small", "model": "flash", "mrr": 16, "budget": 6 * GB},
    {"id": "pro-tp8", "model": "pro", "tp": 8, "budget": 100 * GB},
    {"id": "pro-page128", "model": "pro", "page": 128, "budget": 50 * GB},
    {"id": "pro-page384", "model": "pro", "page": 384, "budget": 64 * 2**30},
    {"id": "pro-mrr1024", "model": "pro", "mrr": 1024, "budget": 130 * GB},
    {"id": "pro-mtp3", "model": "pro", "spec": (3, 2), "budget": 100 * GB},
    {"id": "pro-swa0.2", "model": "pro", "mrr": 64, "swa": 0.2, "budget": 60 * GB},
    {
        "id": "pro-decode",
        "model": "pro",
        "mode": "decode",
        "extra": 32,
        "mrr": 128,
        "budget": 70 * GB,
    },
    {"id": "pro-tp8-dp8", "model": "pro", "tp": 8, "dp": 8, "mrr": 2048, "budget": 140 * GB},
    {"id": "v41-cap", "model": "v41", "mrr": 64, "budget": 60 * GB},
    {
        "id": "v41-cap-decode",
        "model": "v41",
        "mrr": 128,
        "mode": "decode",
        "extra": 4,
        "budget": 80 * GB,
    },
    {"id": "v32-fp8kv", "model": "v32", "page": 64, "kv": "fp8_e4m3", "budget": 50 * GB},
    {"id": "v32-bf16kv", "model": "v32", "page": 64, "kv": "bfloat16", "budget": 60 * GB},
]
# Both must refuse these: a page that is not a multiple of 128, memory for no request.
REFUSED = [
    {"id": "flash-page192", "model": "flash", "page": 192, "budget": 80 * GB},
    {"id": "flash-tiny", "model": "flash", "budget": GB // 10},
]
# The same case first and last: a batch shares one process, so show it leaks nothing.
REPEAT = {**PARITY_CASES[0], "id": "flash-default-again"}
# Head dims whose fp8 keys fill whole scale blocks (the one index-K rule refuses others).
FORMULAS = {"id": "index-k-rows", "index_head_dims": [128, 256, 512]}

# Plugin tests: bf16 index-K with and without the plugin; fp8 / fp4 with it.  SGLang stores
# no bf16 index-K: our plans of these cases are the reference engine's (which does).
FLASH_BF16 = {
    "id": "flash-bf16",
    "model": "flash",
    "tp": 4,
    "index_dtype": "bf16",
    "budget": 126 * 2**30,
}
PRO_BF16_MTP = {
    "id": "pro-bf16-mtp",
    "model": "pro",
    "tp": 8,
    "spec": (3, 2),
    "index_dtype": "bf16",
    "budget": 100 * GB,
}
# The seed's fork kept DSA index-K in a bf16 buffer; SGLang multiplies its fp8 formula by
# that buffer's element size.
V32_BF16 = {
    "id": "v32-bf16",
    "model": "v32",
    "page": 64,
    "kv": "fp8_e4m3",
    "index_dtype": "bf16",
    "fork_bf16_buffer": True,
    "budget": 50 * GB,
}
# A value the plugin cannot read: refused when SGLang sizes the pools, not at load time.
FLASH_BAD_DTYPE = {**FLASH_BF16, "id": "flash-int8", "index_dtype": "int8"}
UNCHANGED = [
    {"id": "flash-fp8", "model": "flash", "tp": 4, "index_dtype": "fp8", "budget": 126 * 2**30},
    {"id": "flash-fp4", "model": "flash", "tp": 4, "index_dtype": "fp4", "budget": 126 * 2**30},
    {
        "id": "v32-fp8",
        "model": "v32",
        "page": 64,
        "kv": "fp8_e4m3",
        "index_dtype": "fp8",
        "budget": 50 * GB,
    },
]
