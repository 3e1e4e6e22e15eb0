"""Every Triton kernel compiled for sm90, sm100 and sm120 on this CPU machine, with Triton's
compiler and bundled ptxas (`dsv4_engine.kernels.targets`): each must compile, spill no
register to local memory, and ask for no more shared memory than its target has; the
indexer's score kernel must multiply on tensor cores.  Compile times are printed at the end
of the run (`conftest.pytest_terminal_summary`).

The compiles run in a child process, and this module imports neither Triton's compiler nor
the kernels: either, imported first, leaves the kernels' CPU interpreter runs in the same
worker (tests/unit/engine/hicache) calling device code."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from dsv4_engine.kernels.limits import TARGETS, Compiled

pytestmark = pytest.mark.shared_fixture

KERNELS = {"store_kernel", "read_kernel", "copy_kernel", "topk_kernel", "score_kernel"}


@pytest.fixture(scope="module")
def compiled() -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "dsv4_engine.kernels.targets", "--json"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert rows, done.stderr
    return rows


@pytest.mark.parametrize("target", TARGETS)
def test_each_kernel_compiles_for_each_target_within_its_limits(compiled, target, record_property):
    rows = [row for row in compiled if row["target"] == target]
    for row in rows:
        record_property("kernel_compile", row)
    problems = {row["case"]: Compiled(**row).problems() for row in rows}
    assert not {case: found for case, found in problems.items() if found}
    assert all(row["registers"] > 0 for row in rows)


def test_every_launched_kernel_is_compiled_for_every_target(compiled):
    assert {row["kernel"] for row in compiled} == KERNELS
    for kernel in KERNELS:
        assert {row["target"] for row in compiled if row["kernel"] == kernel} == set(TARGETS)
    cases = {row["case"] for row in compiled}
    assert {"top-k k512 scores", "top-k k1024 scores"} <= cases, "both presets' index_topk"
    assert {"indexer score d128-fp8 h64", "indexer score d128-bf16 h64"} <= cases


def test_the_indexer_scores_on_tensor_cores_for_every_target(compiled):
    scores = [row for row in compiled if row["kernel"] == "score_kernel"]
    assert {(row["case"], row["target"]) for row in scores if row["mma_instructions"] == 0} == set()


def test_a_spill_or_too_much_shared_memory_is_a_problem():
    fine = Compiled("k", "f", "sm120", 0.1, 128, 0, 99 * 1024, 99 * 1024, 0)
    assert fine.problems() == []
    spilled = Compiled("k", "f", "sm90", 0.1, 255, 64, 0, 227 * 1024, 0)
    assert spilled.problems() == ["64 bytes of local memory (spilled registers)"]
    crowded = Compiled("k", "f", "sm120", 0.1, 128, 0, 99 * 1024 + 1, 99 * 1024, 0)
    assert "> the 101376 B limit" in crowded.problems()[0]
