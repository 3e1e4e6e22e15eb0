"""With the fp8 index-K, the configurator's numbers equal real SGLang 0.5.23's
``DSV4PoolConfigurator`` / ``DefaultPoolConfigurator`` on the same inputs."""

from __future__ import annotations

import pytest
from sglang_cases import our_plan

from dsv4_engine.configurator import ConfigError, index_k_bytes_per_token
from dsv4_engine.features import IndexDtype

pytestmark = pytest.mark.sglang

GB = 10**9
CASES = [
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
REPEAT = {**CASES[0], "id": "flash-default-again"}
FORMULAS = {"id": "index-k-rows", "index_head_dims": [64, 128, 256]}
DSV4_FIELDS = ("full", "swa", "c4", "c128", "c4_state", "c128_state")


@pytest.fixture(scope="module")
def sglang_results(run_sglang):
    return run_sglang([*CASES, *REFUSED, REPEAT, FORMULAS])


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_equals_sglang(case, sglang_results):
    theirs = sglang_results[case["id"]]
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
def test_refuses_what_sglang_refuses(case, sglang_results):
    assert "error" in sglang_results[case["id"]]
    with pytest.raises(ConfigError):
        our_plan(case)


def test_one_process_runs_cases_independently(sglang_results):
    first = sglang_results[CASES[0]["id"]]
    assert sglang_results[REPEAT["id"]] == first


def test_index_k_formulas_equal_sglang_pool_rows(sglang_results):
    """The pool's own per-token rows (the fp4 ones are what SGLang allocates even though
    it budgets fp8 on NVIDIA)."""
    rows = sglang_results[FORMULAS["id"]]["rows"]
    for d, (fp8, fp4) in rows.items():
        assert fp8 == index_k_bytes_per_token(int(d), IndexDtype.FP8)
        assert fp4 == index_k_bytes_per_token(int(d), IndexDtype.FP4)
