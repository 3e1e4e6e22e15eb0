"""The seed's HiCache index-K race, both ways.

Gated: in every trial, every one of 16 concurrent requests reads, after a HiCache load, what
it read with no HiCache at all, bit for bit.  Ungated index-K (the injected bug): requests
read the previous owner's keys and pick another top-k set, and more of them with bf16 than
with fp8 at the same bandwidth, seed for seed (same compute times, only the copy differs).
"""

import pytest

from dsv4_engine.features import IndexDtype
from dsv4_engine.hicache.race import RaceConfig, run_trial

SEEDS = range(8)
DTYPES = (IndexDtype.FP8, IndexDtype.BF16)


@pytest.mark.parametrize("dtype", DTYPES)
def test_with_the_gate_every_read_matches_the_no_hicache_reference(dtype):
    for seed in SEEDS:
        trial = run_trial(RaceConfig(dtype, gated=True, seed=seed))
        assert len(trial.outcomes) == 16
        assert trial.mismatched == 0, f"seed {seed}: {trial.mismatched} requests differ"


@pytest.fixture(scope="module")
def ungated():
    """Paired trials: the same seeds (same compute times, same data) for fp8 and bf16."""
    return {
        dtype: [run_trial(RaceConfig(dtype, gated=False, seed=seed)) for seed in SEEDS]
        for dtype in DTYPES
    }


@pytest.mark.parametrize("dtype", DTYPES)
def test_without_the_gate_index_k_is_stale_and_top_k_changes(ungated, dtype):
    trials = ungated[dtype]
    assert sum(t.stale for t in trials) > 0
    assert sum(t.topk_changed for t in trials) > 0
    # Only index-K skips the gate: every wrong read is explained by a stale key.
    assert all(t.mismatched == t.stale for t in trials)


def test_bf16_index_k_races_more_often_than_fp8(ungated):
    fp8 = sum(t.topk_changed for t in ungated[IndexDtype.FP8])
    bf16 = sum(t.topk_changed for t in ungated[IndexDtype.BF16])
    assert bf16 > fp8, f"top-k changed for {bf16} bf16 vs {fp8} fp8 requests"
