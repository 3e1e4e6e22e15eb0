"""kv-canary violations as one Prometheus counter, read the same way on both engines.

SGLang 0.5.23 reports a kv-canary violation in one place only: a WARNING of the logger
``sglang.srt.kv_canary.runner.violation_reporter`` (``ViolationReporter.log_or_raise_violation``,
violation_reporter.py:105-109 in log mode; raise mode raises the same text), whose first
line is a frozen ``key=value`` summary, ``kv_canary violation: launch_tag=<CanaryLaunchTag>
fail_reason=<reasons joined by +> slot_idx=...`` (violation_reporter.py:154-168, the line
SGLang's own tests parse: sglang/test/kv_canary/violation_log_utils.py:6-8).  It has no
metric, endpoint or /server_info field for it.  So the project counts each such line into
`METRIC` inside the engine process (`dsv4_engine.sglang_plugin.kv_canary`), where SGLang's
multiprocess Prometheus registry serves it on the engine's /metrics; the reference engine
serves the same counter for its own integrity check.

A counter with no violation yet has no sample, so a page without one cannot tell "no
violation" from "not counted" (a plugin that never loaded, a page the router dropped).
Each engine whose kv-canary is on therefore also serves `ARMED` (1, labelled with its
`engine_type`) from the moment its check runs.  A read through sglang-router's
``GET /engine_metrics`` (`dsv4_engine.engine_metrics`: every worker's page, names with
``_`` for ``:``) counts only when every worker on the page is armed, and a PD pair's
prefill and decode both are (`unread`): otherwise the probe says the violations were not
read, and its run cannot PASS.

Pure: imported by the probe and the operator, without torch or prometheus_client.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dsv4_engine import engine_metrics

METRIC = "dsv4:kv_canary_violations_total"
HELP = "kv-canary violations: KV reads whose stored data failed the integrity check."
# The labels of METRIC: SGLang's launch tag and fail reason(s), as its log line names them.
LABELS = ("launch_tag", "fail_reason")
ARMED = "dsv4:kv_canary_armed"
ARMED_HELP = "1 when this engine's kv-canary check runs and its violations are counted."
ENGINE_TYPE = "engine_type"  # SGLang's label: prefill, decode or unified

SGLANG_LOGGER = "sglang.srt.kv_canary.runner.violation_reporter"
SGLANG_LINE = re.compile(r"kv_canary violation: launch_tag=(\S+) fail_reason=(\S+)")

Counts = dict[tuple[str, str, str], int]


@dataclass(frozen=True)
class Violations:
    """One engine's count of one kind of violation."""

    worker: str
    launch_tag: str
    fail_reason: str
    count: int

    def describe(self) -> str:
        return (
            f"{self.count} x launch_tag={self.launch_tag} fail_reason={self.fail_reason}"
            f" on {self.worker or 'the engine'}"
        )


def read(metrics_text: str) -> Counts:
    """Every METRIC sample of a Prometheus text page, by (worker, launch tag, fail reason)."""
    counts: Counts = {}
    for sample in engine_metrics.named(engine_metrics.samples(metrics_text), METRIC):
        key = (
            sample.worker,
            sample.labels.get("launch_tag", ""),
            sample.labels.get("fail_reason", ""),
        )
        counts[key] = counts.get(key, 0) + int(sample.value)
    return counts


def unread(metrics_text: str) -> str | None:
    """Why ``metrics_text`` cannot vouch for the engines' violations, or None when it can:
    every worker on it serves `ARMED`, and where any is a PD prefill or decode, both are."""
    page = engine_metrics.samples(metrics_text)
    armed = {s.worker: s.labels.get(ENGINE_TYPE, "") for s in engine_metrics.named(page, ARMED)
             if s.value >= 1}  # fmt: skip
    if not armed:
        return f"no engine on the page serves {engine_metrics.spelled(ARMED)} (its kv-canary check is not counted)"
    unarmed = sorted(w or "the engine" for w in engine_metrics.workers(page) - armed.keys())
    if unarmed:
        return f"{', '.join(unarmed)}: no {engine_metrics.spelled(ARMED)} (its kv-canary check is not counted)"
    roles = set(armed.values())
    if roles & {"prefill", "decode"} and not {"prefill", "decode"} <= roles:
        missing = ({"prefill", "decode"} - roles).pop()
        return f"no {missing} engine's page (the router left it out, or it never answered)"
    return None


def new_violations(before: Counts, after: Counts) -> tuple[Violations, ...]:
    """What the engines counted between two reads (a restarted engine counts from 0)."""
    out = []
    for key, count in sorted(after.items()):
        grown = count - before.get(key, 0)
        if grown < 0:  # the engine restarted: all it counted since is new
            grown = count
        if grown > 0:
            out.append(Violations(*key, grown))
    return tuple(out)
