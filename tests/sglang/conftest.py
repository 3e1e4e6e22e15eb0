"""Runs real SGLang 0.5.23 pool configurators in a subprocess (see sglang_pool_harness.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dsv4_engine.configurator import (
    EngineSettings,
    load_hf_config,
    model_spec_from_hf_config,
    plan_pools,
)
from dsv4_engine.configurator.result import PoolPlan
from dsv4_engine.features import IndexDtype
from dsv4_engine.presets import preset_config

HARNESS = Path(__file__).with_name("sglang_pool_harness.py")
DSA_CONFIG = Path(__file__).parents[1] / "data" / "deepseek-v32-dsa-config.json"
MODELS = {
    "flash": lambda: preset_config("v4-flash"),
    "pro": lambda: preset_config("v4-pro"),
    "v32": lambda: load_hf_config(DSA_CONFIG),
}


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A directory with a config.json per model: SGLang reads models from a path."""
    dirs = {}
    for name, load in MODELS.items():
        d = tmp_path_factory.mktemp(name)
        (d / "config.json").write_text(json.dumps(load()))
        dirs[name] = str(d)
    return dirs


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
        swa_full_tokens_ratio=case.get("swa", 0.1),
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


@pytest.fixture(scope="session")
def run_sglang(model_dirs: dict[str, str]) -> Callable[..., dict[str, dict[str, Any]]]:
    """Run a batch of case descriptions through real SGLang in one fresh process."""

    def run(cases: list[dict[str, Any]], *, plugin: bool = False) -> dict[str, dict[str, Any]]:
        payload = [
            c
            if "index_head_dims" in c
            else {
                "id": c["id"],
                "model_dir": model_dirs[c["model"]],
                "server_args": sglang_args(c),
                "page_size": c.get("page"),
                "available_bytes": c["budget"],
                "index_dtype": c.get("index_dtype", "fp8"),
                "fork_bf16_buffer": c.get("fork_bf16_buffer", False),
            }
            for c in cases
        ]
        env = {**os.environ, "SGLANG_PLUGINS": "dsv4_index_k"}
        argv = [sys.executable, str(HARNESS), *(["--plugin"] if plugin else [])]
        proc = subprocess.run(
            argv, input=json.dumps(payload), capture_output=True, text=True, env=env, timeout=300
        )
        results = {}
        for line in proc.stdout.splitlines():
            if line.startswith("RESULT "):
                result = json.loads(line.removeprefix("RESULT "))
                results[result.pop("id")] = result
        if len(results) != len(cases):
            pytest.fail(
                f"harness returned {len(results)}/{len(cases)} results:\n{proc.stderr[-3000:]}"
            )
        return results

    return run
