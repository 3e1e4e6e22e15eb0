"""The plugin, loaded by SGLang's own `load_plugins()` from the installed entry point,
stops SGLang from sizing pools for an index-K dtype it does not store, and leaves the
dtypes it does store exactly as SGLang sizes them.  Without it, SGLang silently runs a
bf16 request as fp8."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from sglang_cases import (
    FLASH_BAD_DTYPE,
    FLASH_BF16,
    PRO_BF16_MTP,
    UNCHANGED,
    V32_BF16,
    our_plan,
)

from dsv4_engine.sglang_plugin import DSV4_TARGET, HOOKS

pytestmark = pytest.mark.sglang  # with every SGLang test, on one worker (tests/conftest.py)

HOOKS_HARNESS = Path(__file__).with_name("plugin_hooks_harness.py")


@pytest.fixture
def load_plugins_in_an_engine_process(
    fresh_process: Callable[..., subprocess.CompletedProcess[str]],
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """SGLang's load_plugins() with the project's plugin whitelisted, in a fresh process."""
    env = {**os.environ, "SGLANG_PLUGINS": "dsv4_index_k"}
    return lambda *args: fresh_process(HOOKS_HARNESS, *args, env=env)


def test_sglang_installs_every_hook_of_the_plugin(load_plugins_in_an_engine_process):
    proc = load_plugins_in_an_engine_process()
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert json.loads(line.removeprefix("RESULT ")) == {target: True for target, _ in HOOKS}


def test_sglang_loading_the_plugin_installs_the_counter_without_importing_prometheus(
    load_plugins_in_an_engine_process,
):
    """The kv-canary violation counter (`dsv4_engine.kv_canary`) is on SGLang's violation
    logger once SGLang loads the plugin, and prometheus_client is not imported yet (SGLang
    must set its multiprocess directory first)."""
    proc = load_plugins_in_an_engine_process()
    assert proc.returncode == 0, proc.stderr[-2000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("KV_CANARY ")]
    assert json.loads(line.removeprefix("KV_CANARY ")) == [1, False]


def test_a_hook_sglang_cannot_apply_stops_the_engine_naming_hook_target_and_version(
    load_plugins_in_an_engine_process,
):
    """SGLang renamed the method a hook targets: its HookRegistry would log the failure and
    start the engine without the hook; the plugin stops the process instead."""
    proc = load_plugins_in_an_engine_process("--rename", DSV4_TARGET)
    assert proc.returncode == 1
    assert "RESULT" not in proc.stdout  # load_plugins() did not return
    assert (
        f"dsv4_index_k: SGLang cannot apply hook refuse_unstored_index_dtype to {DSV4_TARGET} "
        "(AttributeError: type object 'DSV4PoolConfigurator' has no attribute "
        "'_get_bytes_per_full_token'). The plugin is written for SGLang 0.5.23; this is "
        "SGLang 0.5.23. Without the hook SGLang would size and run a bf16 index-K request "
        "as fp8: refusing to start."
    ) in proc.stderr


def dsv4_numbers(result):
    return (
        result["bytes_per_full_token"],
        result["fixed_bytes"],
        result["full"],
        result["swa"],
        result["c4"],
        result["c128"],
    )


def plan_numbers(plan):
    pools = [plan.pool(n).tokens for n in ("swa", "c4", "c128")]
    return (plan.bytes_per_full_token, plan.fixed_bytes, plan.full_tokens, *pools)


@pytest.mark.parametrize("case", [FLASH_BF16, PRO_BF16_MTP, V32_BF16], ids=lambda c: c["id"])
def test_sglang_with_the_plugin_refuses_bf16_index_k_naming_the_field(case, sglang_with_plugin):
    error = sglang_with_plugin[case["id"]]["error"]
    assert error.startswith("ConfigError: DSV4_INDEX_DTYPE: indexDtype bf16: SGLang 0.5.23 ")
    assert "fp8 (132 B per key) or fp4 (68 B" in error
    assert "only in the CPU reference engine" in error


def test_a_value_the_plugin_cannot_read_stops_sizing(sglang_with_plugin):
    """SGLang swallows errors its plugins raise while loading; this one surfaces where the
    pools are sized, so the engine does not start with a dtype nobody checked."""
    assert sglang_with_plugin[FLASH_BAD_DTYPE["id"]]["error"] == (
        "ConfigError: DSV4_INDEX_DTYPE: expected one of fp8, bf16, fp4, got 'int8'"
    )


@pytest.mark.parametrize("case", UNCHANGED, ids=lambda c: c["id"])
def test_plugin_changes_nothing_for_fp8_and_fp4(case, sglang_with_plugin):
    theirs = sglang_with_plugin[case["id"]]
    ours = our_plan(case)
    assert (theirs["bytes_per_full_token"], theirs["full"]) == (
        ours.bytes_per_full_token,
        ours.full_tokens,
    )
    if case["model"] != "v32":
        assert theirs["indexer_bytes_per_token"] == 132  # fp4 too: SGLang budgets fp8 on NVIDIA


def test_dsv4_sglang_without_plugin_sizes_a_bf16_request_as_fp8(sglang_without_plugin):
    """What the plugin prevents: upstream DSV4 sizing ignores the requested dtype, prices
    132-byte fp8 rows and stores fp8; the bf16 flag would change nothing."""
    theirs = sglang_without_plugin[FLASH_BF16["id"]]
    fp8 = our_plan({**FLASH_BF16, "index_dtype": "fp8"})
    assert theirs["indexer_bytes_per_token"] == 132
    assert dsv4_numbers(theirs) == plan_numbers(fp8)
    with pytest.raises(ValueError, match="indexDtype bf16: SGLang 0.5.23 stores"):
        our_plan(FLASH_BF16)


def test_dsa_sglang_with_the_forks_bf16_buffer_over_reserves_like_the_legacy_formula(
    sglang_without_plugin,
):
    """The seed's fork kept DSA index-K in a bf16 buffer: SGLang's fp8 formula times that
    buffer's element size is the configurator's legacy mode, 8 bytes per key above the
    256-byte rows (which the reference engine stores)."""
    theirs = sglang_without_plugin[V32_BF16["id"]]
    legacy = our_plan({**V32_BF16, "legacy": True})
    rows = our_plan({**V32_BF16, "engine": "reference"})
    assert (theirs["bytes_per_full_token"], theirs["full"]) == (
        legacy.bytes_per_full_token,
        legacy.full_tokens,
    )
    # 61 indexer layers x (264 - 256) bytes per token, for every token SGLang sizes.
    assert theirs["bytes_per_full_token"] - rows.bytes_per_full_token == 61 * 8
    assert theirs["full"] < rows.full_tokens
