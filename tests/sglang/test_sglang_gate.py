"""SGLang 0.5.23 gates every DeepSeek-V4 pool read on its layer's HiCache load, shown on
its real pool class and LayerDoneCounter (dsv4_engine.sglang_plugin.gate_check, which the
engine image also runs at build time), and the check catches a getter that does not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4_engine.sglang_plugin.gate_check import MUST_WAIT

pytestmark = pytest.mark.sglang

HARNESS = Path(__file__).with_name("gate_check_harness.py")
INDEX_K = "get_index_k_with_scale_buffer"
KV = "get_extra_key_buffer"
SCENARIOS = [
    "as-pinned",
    f"no-wait:{INDEX_K}",
    f"no-wait:{KV}",
    f"next-layer:{INDEX_K}",
    "new-getter",
]


@pytest.fixture(scope="module")
def results():
    proc = subprocess.run(
        [sys.executable, str(HARNESS)],
        input=json.dumps(SCENARIOS),
        capture_output=True,
        text=True,
        timeout=300,
    )
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
    assert f"{INDEX_K} fp8 layer 2: waited for layer 3, not layer 2" in broken["failed"]


def test_a_getter_the_check_does_not_know_fails_it(results):
    assert results["new-getter"]["problems"] == [
        "get_new_buffer: a getter this check does not classify (must it wait?)"
    ]
    assert results["new-getter"]["exit_code"] == 1
