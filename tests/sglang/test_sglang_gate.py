"""SGLang 0.5.23 gates every DeepSeek-V4 pool read on its layer's HiCache load, shown on
its real pool class, wired to its LayerDoneCounter by SGLang's own HiCache assembly, on a
whole model and on a later pipeline stage (dsv4_engine.sglang_plugin.gate_check, which the
engine image also runs at build time); and the check catches SGLang broken in each way
below, by patching its classes or recompiling its functions from edited source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsv4_engine.sglang_plugin.gate_check import MUST_WAIT, STAGES

pytestmark = pytest.mark.sglang  # with every SGLang test, on one worker (tests/conftest.py)

HARNESS = Path(__file__).with_name("gate_check_harness.py")
INDEX_K = "get_index_k_with_scale_buffer"
KV = "get_extra_key_buffer"
# SGLang's assembly leaving the pool with no counter, or with one no load records into.
UNWIRED = {
    "edit:unregistered-assembler+unregistered-controller": "none",
    "edit:fresh-counter+unregistered-assembler": (
        "another LayerDoneCounter, which no load records into"
    ),
}
# One registration deleted, or the controller replacing its first counter: still wired.
STILL_WIRED = [
    "edit:unregistered-assembler",
    "edit:unregistered-controller",
    "edit:fresh-counter",
]
SCENARIOS = [
    "as-pinned",
    f"no-wait:{INDEX_K}",
    f"no-wait:{KV}",
    f"next-layer:{INDEX_K}",
    "new-getter",
    "edit:no-offset",
    "edit:counter-off-by-one",
    *UNWIRED,
    *STILL_WIRED,
]
PP_STAGE = STAGES[1].label


@pytest.fixture(scope="module")
def results(fresh_process):
    proc = fresh_process(HARNESS, input=json.dumps(SCENARIOS))
    found = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line.removeprefix("RESULT "))
            found[result["scenario"]] = result
    assert set(found) == set(SCENARIOS), proc.stderr[-3000:]
    return found


def test_every_getter_of_the_pinned_sglang_waits_for_its_layer(results):
    pinned = results["as-pinned"]
    assert pinned["failed"] == [] and pinned["problems"] == []
    assert pinned["passed"] == sorted(g.name for g in MUST_WAIT)
    assert pinned["calls"] == 148  # 2 variants x (40 calls on all 6 layers + 34 on layers 2-5)
    assert pinned["exit_code"] == 0


@pytest.mark.parametrize("getter", [INDEX_K, KV])
def test_a_getter_whose_wait_is_patched_out_fails_the_check(results, getter):
    broken = results[f"no-wait:{getter}"]
    assert broken["failed"], "the check passed a getter that does not wait"
    assert all(f.startswith(f"{getter} ") for f in broken["failed"])
    assert any("returned before layer 2's load finished" in f for f in broken["failed"])
    assert getter not in broken["passed"]
    # `python -m dsv4_engine.sglang_plugin.gate_check` exits with this: the image build fails.
    assert broken["exit_code"] == 1
    assert "does NOT gate every read" in broken["summary"]


def test_a_getter_waiting_for_another_layer_fails_the_check(results):
    broken = results[f"next-layer:{INDEX_K}"]
    assert f"{INDEX_K} fp8 all layers, layer 2: waited for layer 3, not layer 2" in broken["failed"]
    assert f"{INDEX_K} fp8 {PP_STAGE}, layer 2: waited for layer 3, not layer 2" in broken["failed"]
    assert broken["exit_code"] == 1


def test_a_getter_the_check_does_not_know_fails_it(results):
    assert results["new-getter"]["problems"] == [
        "get_new_buffer: a getter this check does not classify (must it wait?)"
    ]
    assert results["new-getter"]["exit_code"] == 1


def test_a_wait_without_the_stage_offset_fails_on_a_later_pipeline_stage(results):
    """`wait_until(layer_id)` instead of `layer_id - self.start_layer`: the same on a stage
    that starts at layer 0, so only the pipeline stage catches it, there every call."""
    broken = results["edit:no-offset"]
    assert len(broken["failed"]) == 68 and broken["exit_code"] == 1
    assert all(f" {PP_STAGE}, " in f for f in broken["failed"])
    assert f"{INDEX_K} fp8 {PP_STAGE}, layer 2: waited for layer 4, not layer 2" in broken["failed"]
    assert any(
        f.startswith(f"{INDEX_K} fp8 {PP_STAGE}, layer 4: raised IndexError")
        for f in broken["failed"]
    )  # local layer 4 of a 4-layer stage does not exist


def test_a_counter_that_releases_a_layer_early_fails_the_check(results):
    """SGLang's LayerDoneCounter waiting for the layer before the one asked: every read
    goes through once the previous layer has loaded."""
    broken = results["edit:counter-off-by-one"]
    assert len(broken["failed"]) == broken["calls"] and broken["exit_code"] == 1
    assert (
        f"{INDEX_K} fp8 all layers, layer 4: returned before layer 4's load finished "
        "(waited: [3])" in broken["failed"]
    )


@pytest.mark.parametrize("scenario", UNWIRED)
def test_a_pool_sglangs_assembly_leaves_without_its_counter_fails_the_check(results, scenario):
    """Both places SGLang registers the controller's counter with the pool deleted; or the
    hybrid controller replacing its first counter (registered by the base controller) and
    the assembly's registration of the new one deleted.  No getter waits for a load, and
    the check says why."""
    broken = results[scenario]
    assert len(broken["failed"]) == broken["calls"] == 148 and broken["exit_code"] == 1
    assert all("load finished" in f and "waited for" not in f for f in broken["failed"])
    assert broken["problems"] == [
        f"{variant} {stage.label}: SGLang's HiCache assembly left the pool without its cache "
        f"controller's LayerDoneCounter (the pool holds {UNWIRED[scenario]})"
        for variant in ("fp8", "fp4")
        for stage in STAGES
    ]


@pytest.mark.parametrize("scenario", STILL_WIRED)
def test_the_pool_is_wired_while_one_registration_reaches_it(results, scenario):
    """SGLang 0.5.23 registers the counter twice: `HiCacheController.__init__`
    (managers/cache_controller.py, run by HybridCacheController's `super().__init__`) and
    `_apply_stack_result` (mem_cache/hybrid_cache/hybrid_pool_assembler.py).  The hybrid
    controller makes a new counter, which only the second registers, when its transfer
    layer count differs from the pool's `layer_num`; for DeepSeek-V4 both are the stage's
    layer count, so both register the same counter and deleting either one changes nothing
    a read can see: the check rightly passes.  With the new counter forced (fresh-counter),
    the assembly's registration wires the pool, and deleting it fails (test above)."""
    survived = results[scenario]
    assert survived["failed"] == [] and survived["problems"] == []
    assert survived["exit_code"] == 0
