"""Where the probe's kv-canary evidence comes from on SGLang 0.5.23, on its own classes (real
imports, no copy): a violation is a row of the `ViolationLog` ring the canary kernels write
(kv_canary/state.py), and `ViolationReporter` — the only place SGLang surfaces it — logs it
as a WARNING whose first line is its frozen ``kv_canary violation: launch_tag=...
fail_reason=...`` summary (runner/violation_reporter.py).  SGLang exposes no metric or
endpoint for it: the project's plugin counts those lines into `kv_canary.METRIC`, the
counter the probe reads back through the router, and its parser agrees with SGLang's own;
SGLang's plugin loader installs it (tests/sglang/test_plugin.py, in a fresh process)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from dsv4_engine import kv_canary
from dsv4_engine.sglang_plugin.kv_canary import install

pytestmark = pytest.mark.sglang


def _config(mode):
    from sglang.kernels.ops.kv_canary.consts import RealKvHashMode
    from sglang.srt.kv_canary.config import CanaryConfig

    return CanaryConfig(
        mode=mode,
        ring_capacity=4,
        sweep_interval=0,
        real_kv_hash_mode=RealKvHashMode.PARTIAL,
        enable_write_input_assert=False,
        enable_verify_token_assert=False,
        stats_print_every_n_steps=0,
    )


def _reporter_with_violations(mode, *rows):
    """A `ViolationReporter` over a CPU `CanaryDeviceState` whose ring holds ``rows`` (tag,
    fail reason bits), written as the verify kernel writes them."""
    import torch
    from sglang.kernels.ops.kv_canary.consts import (
        VIOLATION_FIELD_FAIL_REASON_BITS,
        VIOLATION_FIELD_KERNEL_KIND,
        VIOLATION_FIELD_POSITION,
        VIOLATION_FIELD_SLOT_IDX,
    )
    from sglang.kernels.ops.kv_canary.verify import CanaryLaunchTag
    from sglang.srt.kv_canary.runner.violation_reporter import ViolationReporter
    from sglang.srt.kv_canary.state import CanaryDeviceState

    config = _config(mode)
    state = CanaryDeviceState.allocate(
        config=config, device=torch.device("cpu"), num_tags=len(CanaryLaunchTag)
    )
    log = state.violation_log
    for i, (tag, bits) in enumerate(rows):
        log.violation_ring[i, VIOLATION_FIELD_KERNEL_KIND] = int(tag)
        log.violation_ring[i, VIOLATION_FIELD_SLOT_IDX] = 40 + i
        log.violation_ring[i, VIOLATION_FIELD_POSITION] = 7
        log.violation_ring[i, VIOLATION_FIELD_FAIL_REASON_BITS] = int(bits)
    log.violation_write_index[0] = len(rows)
    return ViolationReporter(config=config, device_state=state)


@pytest.fixture
def counted():
    """The plugin's handler on SGLang's violation logger, counting into its own registry."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    handler = install(registry)
    yield lambda: kv_canary.read(generate_latest(registry).decode())
    logging.getLogger(kv_canary.SGLANG_LOGGER).removeHandler(handler)


def test_log_mode_violations_become_the_counter_the_probe_reads(counted, caplog):
    from sglang.kernels.ops.kv_canary.consts import FailReason
    from sglang.kernels.ops.kv_canary.verify import CanaryLaunchTag
    from sglang.srt.kv_canary.config import CanaryMode
    from sglang.test.kv_canary.violation_log_utils import find_violation_in_log

    reporter = _reporter_with_violations(
        CanaryMode.LOG,
        (CanaryLaunchTag.HEAD_K_FULL, FailReason.VERIFY_REAL_KV_HASH_MISMATCH),
        (
            CanaryLaunchTag.SWEEP_V_SWA,
            FailReason.VERIFY_CHAIN_HASH_MISMATCH | FailReason.VERIFY_POSITION_MISMATCH,
        ),
    )
    with caplog.at_level(logging.WARNING, logger=kv_canary.SGLANG_LOGGER):
        reporter.log_or_raise_violation(outer_step_counter=3)
    assert not reporter.is_raised, "log mode keeps the engine serving"
    assert counted() == {
        ("", "HEAD_K_FULL", "verify_real_kv_hash"): 1,
        ("", "SWEEP_V_SWA", "verify_chain_hash+verify_position"): 1,
    }
    # The line the counter parses is the one SGLang's own tests parse.
    assert find_violation_in_log(
        caplog.text, launch_tag_patterns=("SWEEP_*_SWA",), fail_reason="verify_position"
    )
    # Logged once: the next pump with nothing new counts nothing more.
    reporter.log_or_raise_violation(outer_step_counter=4)
    assert sum(counted().values()) == 2


def test_raise_mode_stops_the_engine_before_anything_is_logged(counted):
    """Why a canary runs kv-canary in log mode: in raise mode the violation is an exception
    in the scheduler (the engine stops), never a log line, so nothing counts it."""
    from sglang.kernels.ops.kv_canary.consts import FailReason
    from sglang.kernels.ops.kv_canary.verify import CanaryLaunchTag
    from sglang.srt.kv_canary.config import CanaryMode

    reporter = _reporter_with_violations(
        CanaryMode.RAISE, (CanaryLaunchTag.TAIL_K_FULL, FailReason.VERIFY_CHAIN_HASH_MISMATCH)
    )
    with pytest.raises(RuntimeError, match="kv_canary violation: launch_tag=TAIL_K_FULL"):
        reporter.log_or_raise_violation(outer_step_counter=1)
    assert counted() == {}


def test_sglang_surfaces_violations_only_through_its_reporter():
    """No metric and no endpoint of SGLang's own carries them: outside the canary's own
    package nothing reads the violation ring, and neither the HTTP server nor the metrics
    collector mentions the canary.  The reporter's log line, on the logger the plugin
    listens to, is the signal."""
    from sglang.srt.kv_canary.runner import violation_reporter

    assert violation_reporter.logger.name == kv_canary.SGLANG_LOGGER
    srt = Path(violation_reporter.__file__).parents[2]
    readers = {
        path.relative_to(srt).parts[0]
        for path in srt.rglob("*.py")
        if "violation_write_index" in path.read_text(errors="replace")
    }
    assert readers == {"kv_canary"}
    for module in ("entrypoints/http_server.py", "observability/metrics_collector.py"):
        assert "canary" not in (srt / module).read_text().lower(), module
