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
