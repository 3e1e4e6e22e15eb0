"""The plugin, loaded by SGLang's own `load_plugins()` from the installed entry point,
makes SGLang's configurators size a bf16 index-K like the configurator does."""

from __future__ import annotations

import pytest
from sglang_cases import FLASH_BF16, PRO_BF16_MTP, UNCHANGED, V32_BF16, our_plan

pytestmark = pytest.mark.sglang


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


@pytest.mark.parametrize("case", [FLASH_BF16, PRO_BF16_MTP], ids=lambda c: c["id"])
def test_dsv4_bf16_sglang_with_plugin_equals_ours(case, sglang_with_plugin):
    theirs = sglang_with_plugin[case["id"]]
    assert theirs["indexer_bytes_per_token"] == 256
    assert dsv4_numbers(theirs) == plan_numbers(our_plan(case))


def test_dsa_bf16_sglang_with_plugin_equals_ours(sglang_with_plugin):
    ours = our_plan(V32_BF16)
    theirs = sglang_with_plugin[V32_BF16["id"]]
    assert (theirs["bytes_per_full_token"], theirs["full"]) == (
        ours.bytes_per_full_token,
        ours.full_tokens,
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


def test_dsa_sglang_without_plugin_over_reserves_like_the_legacy_formula(sglang_without_plugin):
    theirs = sglang_without_plugin[V32_BF16["id"]]
    legacy = our_plan({**V32_BF16, "legacy": True})
    fixed = our_plan(V32_BF16)
    assert (theirs["bytes_per_full_token"], theirs["full"]) == (
        legacy.bytes_per_full_token,
        legacy.full_tokens,
    )
    # 61 indexer layers x (264 - 256) bytes per token, for every token SGLang sizes.
    assert theirs["bytes_per_full_token"] - fixed.bytes_per_full_token == 61 * 8
    assert theirs["full"] < fixed.full_tokens


def test_dsv4_sglang_without_plugin_budgets_bf16_keys_at_the_fp8_size(sglang_without_plugin):
    """Upstream DSV4 sizing ignores the index-K dtype: a bf16 index-K would get 132 B of
    budget for 256 B rows.  (The seed's fork multiplied that by 2: 264 B, the legacy mode.)"""
    theirs = sglang_without_plugin[FLASH_BF16["id"]]
    fp8 = our_plan({**FLASH_BF16, "index_dtype": "fp8"})
    bf16 = our_plan(FLASH_BF16)
    assert theirs["indexer_bytes_per_token"] == 132
    assert dsv4_numbers(theirs) == plan_numbers(fp8)
    assert theirs["bytes_per_full_token"] < bf16.bytes_per_full_token
