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
"""

from __future__ import annotations

import logging
from typing import Any

from dsv4_engine.kv_canary import HELP, LABELS, METRIC, SGLANG_LINE, SGLANG_LOGGER


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


def install(registry: Any = None) -> ViolationCounter:
    handler = ViolationCounter(registry)
    logging.getLogger(SGLANG_LOGGER).addHandler(handler)
    return handler
