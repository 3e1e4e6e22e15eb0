"""SGLang's kv-canary violations as `dsv4_engine.kv_canary.METRIC` on the engine's /metrics.

SGLang logs each violation (`dsv4_engine.kv_canary` cites where) and counts it nowhere a
scrape can see.  `install` attaches a logging handler to SGLang's violation logger in every
process that loads plugins (the scheduler, which runs the model and logs the violations,
loads them first: scheduler.py ``run_scheduler_process``); each violation line it logs
counts into a Prometheus counter.  With ``--enable-metrics`` SGLang runs prometheus_client
in multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, utils/common.py
``set_prometheus_multiproc_dir``) and its /metrics collects every process's counters, this
one included.  The counter is made at the first violation, never at plugin load: the main
process loads plugins before it sets ``PROMETHEUS_MULTIPROC_DIR``, and prometheus_client
must not be imported there before it (SGLang's own rule, common.py).

A counter with no violation has no sample, and a page without one cannot tell "none" from
"not counted".  So the engine also serves `ARMED` (1, labelled with its `engine_type`) from
the moment SGLang's kv-canary check exists in it: `mark_armed` runs after SGLang builds its
`ViolationReporter` (kv_canary/runner/violation_reporter.py), which it does only with
``--kv-canary`` on, in the process that runs the check (its metrics directory set by then).
The probe reads a page without it as "violations not read" (`dsv4_engine.kv_canary.unread`).
"""

from __future__ import annotations

import logging
from typing import Any

from dsv4_engine.kv_canary import (
    ARMED,
    ARMED_HELP,
    ENGINE_TYPE,
    HELP,
    LABELS,
    METRIC,
    SGLANG_LINE,
    SGLANG_LOGGER,
)

# SGLang builds one of these wherever its kv-canary check runs (`mark_armed` follows it).
REPORTER_TARGET = "sglang.srt.kv_canary.runner.violation_reporter.ViolationReporter.__init__"


class ViolationCounter(logging.Handler):
    """Counts SGLang's violation lines by launch tag and fail reason into ``registry``
    (None: prometheus_client's default, the one SGLang's multiprocess /metrics collects)."""

    def __init__(self, registry: Any = None) -> None:
        super().__init__(logging.WARNING)
        self._registry = registry
        self._counter: Any = None

    def emit(self, record: logging.LogRecord) -> None:
        for tag, reason in SGLANG_LINE.findall(record.getMessage()):
            self.counter().labels(launch_tag=tag, fail_reason=reason).inc()

    def counter(self) -> Any:
        if self._counter is None:
            from prometheus_client import REGISTRY, Counter

            registry = REGISTRY if self._registry is None else self._registry
            self._counter = Counter(METRIC.removesuffix("_total"), HELP, LABELS, registry=registry)
        return self._counter


def mark_armed(result: Any, *_: Any, registry: Any = None, **__: Any) -> Any:
    """AFTER hook of `REPORTER_TARGET`: this engine's page says its check is counted
    (`ARMED`, labelled with SGLang's `engine_type` for its disaggregation mode)."""
    from prometheus_client import REGISTRY, Gauge
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.runtime_context import get_disagg

    engine_type = DisaggregationMode.to_engine_type(get_disagg().disaggregation_mode)
    gauge = Gauge(
        ARMED,
        ARMED_HELP,
        (ENGINE_TYPE,),
        registry=REGISTRY if registry is None else registry,
        multiprocess_mode="max",
    )
    gauge.labels(**{ENGINE_TYPE: engine_type}).set(1)
    return result


def install(registry: Any = None) -> ViolationCounter:
    handler = ViolationCounter(registry)
    logging.getLogger(SGLANG_LOGGER).addHandler(handler)
    return handler
