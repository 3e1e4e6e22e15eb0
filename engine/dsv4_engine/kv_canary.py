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
serves the same counter for its own integrity check.  A router's ``GET /engine_metrics``
(every worker's /metrics on one page: sglang-router 0.3.2 serves the route, and so does
the reference router, labelling each sample ``worker_addr``) brings every engine's count to
the probe, which compares it before and after its run.  Samples without that label sum
into one count per launch tag and fail reason: detection does not depend on the label.

Pure: imported by the probe and the operator, without torch or prometheus_client.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

METRIC = "dsv4:kv_canary_violations_total"
HELP = "kv-canary violations: KV reads whose stored data failed the integrity check."
# The labels of METRIC: SGLang's launch tag and fail reason(s), as its log line names them.
LABELS = ("launch_tag", "fail_reason")
WORKER_LABEL = "worker_addr"  # the engine a sample is from (the reference router's label)

SGLANG_LOGGER = "sglang.srt.kv_canary.runner.violation_reporter"
SGLANG_LINE = re.compile(r"kv_canary violation: launch_tag=(\S+) fail_reason=(\S+)")

_SAMPLE = re.compile(rf"^{re.escape(METRIC)}(?:{{(?P<labels>[^}}]*)}})? (?P<value>\S+)$", re.M)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


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


def read(metrics_text: str) -> dict[tuple[str, str, str], int]:
    """Every METRIC sample of a Prometheus text page, by (worker, launch tag, fail reason)."""
    counts: dict[tuple[str, str, str], int] = {}
    for match in _SAMPLE.finditer(metrics_text):
        labels = dict(_LABEL.findall(match["labels"] or ""))
        key = (
            labels.get(WORKER_LABEL, ""),
            labels.get("launch_tag", ""),
            labels.get("fail_reason", ""),
        )
        counts[key] = counts.get(key, 0) + int(float(match["value"]))
    return counts


def new_violations(
    before: dict[tuple[str, str, str], int], after: dict[tuple[str, str, str], int]
) -> tuple[Violations, ...]:
    """What the engines counted between two reads (a restarted engine counts from 0)."""
    out = []
    for key, count in sorted(after.items()):
        grown = count - before.get(key, 0)
        if grown < 0:  # the engine restarted: all it counted since is new
            grown = count
        if grown > 0:
            out.append(Violations(*key, grown))
    return tuple(out)
