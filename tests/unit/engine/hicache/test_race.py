"""The seed's HiCache index-K race, both ways.

Gated: in every trial, every one of 16 concurrent requests reads, after a HiCache load, what
it read with no HiCache at all, bit for bit, and the pool observes no read of a page its
load had not landed (though reads did meet loads in flight).  Ungated index-K (the injected
bug): requests read the previous owner's keys and pick another top-k set, the pool counts
those reads, and more requests race with bf16 than with fp8 at the same bandwidth, seed for
seed (same compute times, only the copy differs).

The indexer scores and selects with the pool's kernels; the same trials also run on the
Triton backend, fewer of them since it runs under Triton's CPU interpreter there.
"""

import os
import pickle
import subprocess
import sys

import pytest

from dsv4_engine.features import IndexDtype
from dsv4_engine.hicache.race import RaceConfig, run_trial

pytestmark = pytest.mark.shared_fixture

SEEDS = range(8)
DTYPES = (IndexDtype.FP8, IndexDtype.BF16)


def assert_gated_trial_clean(trial):
    assert len(trial.outcomes) == trial.config.num_requests
    seed = trial.config.seed
    assert trial.mismatched == 0, f"seed {seed}: {trial.mismatched} requests differ"
    assert (trial.stale_index_k_reads, trial.stale_kv_reads) == (0, 0), f"seed {seed}"


def assert_ungated_trials_race(trials):
    assert sum(t.stale for t in trials) > 0
    assert sum(t.topk_changed for t in trials) > 0
    assert sum(t.stale_index_k_reads for t in trials) > 0
    for t in trials:
        # Only index-K skips the gate: every wrong read is explained by a stale key, and
        # the pool counted each request that read one (it checks before the read).
        assert t.mismatched == t.stale
        assert t.stale_index_k_reads >= t.stale
        assert t.stale_kv_reads == 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_with_the_gate_every_read_matches_the_no_hicache_reference(dtype):
    trials = [run_trial(RaceConfig(dtype, gated=True, seed=seed)) for seed in SEEDS]
    for trial in trials:
        assert_gated_trial_clean(trial)
    assert sum(t.blocked_reads for t in trials) > 0, "no read ever met a load in flight"


@pytest.fixture(scope="module")
def ungated():
    """Paired trials: the same seeds (same compute times, same data) for fp8 and bf16."""
    return {
        dtype: [run_trial(RaceConfig(dtype, gated=False, seed=seed)) for seed in SEEDS]
        for dtype in DTYPES
    }


@pytest.mark.parametrize("dtype", DTYPES)
def test_without_the_gate_index_k_is_stale_and_top_k_changes(ungated, dtype):
    assert_ungated_trials_race(ungated[dtype])


def test_bf16_index_k_races_more_often_than_fp8(ungated):
    fp8 = sum(t.topk_changed for t in ungated[IndexDtype.FP8])
    bf16 = sum(t.topk_changed for t in ungated[IndexDtype.BF16])
    assert bf16 > fp8, f"top-k changed for {bf16} bf16 vs {fp8} fp8 requests"


# A gated and an ungated trial on the Triton backend, pickled to the file argv[1].
TRITON_TRIALS = """
import pickle, sys
from dsv4_engine.features import IndexDtype
from dsv4_engine.hicache.race import RaceConfig, run_trial
trials = {
    gated: run_trial(
        RaceConfig(IndexDtype.BF16, gated=gated, seed=0, num_requests=8, backend="triton")
    )
    for gated in (True, False)
}
with open(sys.argv[1], "wb") as out:
    pickle.dump(trials, out)
"""


@pytest.fixture(scope="module")
def triton_trials(tmp_path_factory):
    """{gated: trial} on the Triton backend, run in a child process.

    The race is timed for CPU copies (throttled), so its kernels take CPU tensors: Triton's
    interpreter, on any machine.  It must be on before Triton is first imported (Triton's
    own library functions are decorated then), and this worker may have imported Triton
    already: compiled, for the kernel tests on a CUDA machine."""
    path = tmp_path_factory.mktemp("triton-race") / "trials.pickle"
    done = subprocess.run(
        [sys.executable, "-c", TRITON_TRIALS, str(path)],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return pickle.loads(path.read_bytes())


@pytest.mark.parametrize("gated", [True, False], ids=["gated", "ungated"])
def test_on_the_triton_backend_too(triton_trials, gated):
    trial = triton_trials[gated]
    if gated:
        assert_gated_trial_clean(trial)
        assert trial.blocked_reads > 0
    else:
        assert_ungated_trials_race([trial])
