"""`dsv4ctl probe` with the tool-call echo probes against an engine that truly corrupts: the
reference engine's echo model (issue 19's Done-when).  Gated HiCache + bf16 index-K ->
PASS; the index-K race injected -> FAIL, with garbled calls in the report.  Its device pool
is small, as a canary's HiCache roles run it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4_engine.probe.outcome import Outcome
from dsv4_engine.probe.settings import ECHO_MODEL_PROBES

pytestmark = pytest.mark.slow

FLAGS = (
    "--reference-model", "echo", "--enable-hierarchical-cache", "--hicache-ratio", "2",
    "--index-dtype", "bf16", "--max-total-tokens", "8192",
)  # fmt: skip
# Garbled tool calls: every class but a warm answer that differs from the cold one.
GARBLED = {o.value for o in Outcome if o.is_corruption} - {Outcome.CACHE_MISMATCH.value}


def probe(url: str, report: Path, max_rate: float, *flags: str) -> tuple[int, dict]:
    """`dsv4ctl probe` with the reference backend's defaults (the probe set included)."""
    command = [
        str(Path(sys.executable).with_name("dsv4ctl")), "probe", url, "--backend", "reference",
        "--concurrency", "16", "--max-corruption-rate", str(max_rate), "--report", str(report),
        *flags,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=400)
    return done.returncode, json.loads(report.read_text())


def test_the_gated_echo_model_passes_the_tool_call_probes(start_server, tmp_path):
    code, report = probe(start_server(*FLAGS), tmp_path / "gated.json", max_rate=0.1)
    assert report["verdict"] == "PASS" and code == 0, report["reasons"]
    assert set(report["probes"]["applicable"]) == {p.value for p in ECHO_MODEL_PROBES}
    assert report["counts"]["VALID"] == report["samples"]["judged"] > 0


def test_the_index_k_race_garbles_the_echo_models_tool_calls(start_server, tmp_path):
    """With the reference engine's offload knob, every echo request reads its prefix back
    from the host tier, where the race is: the garbled calls show within tens of samples.
    (By eviction alone fewer requests take that path; a canary's FAIL through it is e2e.)"""
    url = start_server(*FLAGS, env={"DSV4_INJECT_UNGATED_INDEX_K": "1"})
    code, report = probe(url, tmp_path / "raced.json", 0.02, "--admin-offload-path", "default")
    assert report["verdict"] == "FAIL" and code == 1, report["reasons"]
    garbled = {cls for cls, n in report["counts"].items() if n} & GARBLED
    assert garbled, report["counts"]  # broken calls, not only warm != cold
    for cls in garbled:
        for example in report["examples"][cls]:  # each beside the call it should have been
            assert example["expected"].startswith("\n\n<｜DSML｜tool_calls>")
            assert example["excerpt"] != example["expected"]
