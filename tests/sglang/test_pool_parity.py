"""With the fp8 index-K, the configurator's numbers equal real SGLang 0.5.23's
``DSV4PoolConfigurator`` / ``DefaultPoolConfigurator`` on the same inputs."""

from __future__ import annotations

import pytest
from sglang_cases import FORMULAS, PARITY_CASES, REFUSED, REPEAT, our_plan

from dsv4_engine.configurator import ConfigError, index_k_bytes_per_token
from dsv4_engine.features import IndexDtype

pytestmark = pytest.mark.sglang  # with every SGLang test, on one worker (tests/conftest.py)

DSV4_FIELDS = ("full", "swa", "c4", "c128", "c4_state", "c128_state")


@pytest.mark.parametrize("case", PARITY_CASES, ids=[c["id"] for c in PARITY_CASES])
def test_equals_sglang(case, sglang_without_plugin):
    theirs = sglang_without_plugin[case["id"]]
    assert "error" not in theirs, theirs
    ours = our_plan(case)
    assert ours.page_size == theirs["page_size"]
    assert ours.bytes_per_full_token == theirs["bytes_per_full_token"]
    if case["model"] == "v32":
        assert theirs["configurator"] == "DefaultPoolConfigurator"
        assert ours.full_tokens == theirs["full"]
        return
    assert theirs["configurator"] == "DSV4PoolConfigurator"
    assert ours.fixed_bytes == theirs["fixed_bytes"]
    assert ours.max_running_requests_per_worker == theirs["max_running_requests_per_worker"]
    assert ours.swa_mode == theirs["swa_mode"]
    counts = {
        "full": ours.full_tokens,
        **{
            name: ours.pool(name).tokens for name in ("swa", "c4", "c128", "c4_state", "c128_state")
        },
    }
    assert counts == {f: theirs[f] for f in DSV4_FIELDS}


@pytest.mark.parametrize("case", REFUSED, ids=[c["id"] for c in REFUSED])
def test_refuses_what_sglang_refuses(case, sglang_without_plugin):
    assert "error" in sglang_without_plugin[case["id"]]
    with pytest.raises(ConfigError):
        our_plan(case)


def test_one_process_runs_cases_independently(sglang_without_plugin):
    first = sglang_without_plugin[PARITY_CASES[0]["id"]]
    assert sglang_without_plugin[REPEAT["id"]] == first


def test_index_k_formulas_equal_sglang_pool_rows(sglang_without_plugin):
    """The pool's own per-token rows (the fp4 ones are what SGLang allocates even though
    it budgets fp8 on NVIDIA)."""
    rows = sglang_without_plugin[FORMULAS["id"]]["rows"]
    for d, (fp8, fp4) in rows.items():
        assert fp8 == index_k_bytes_per_token(IndexDtype.FP8, int(d))
        assert fp4 == index_k_bytes_per_token(IndexDtype.FP4, int(d))
