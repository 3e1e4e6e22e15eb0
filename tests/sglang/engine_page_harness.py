"""Prints the /metrics page of an SGLang 0.5.23 engine process that finished one request
with host-tier tokens and runs a kv-canary check with the project's plugin loaded: SGLang's
own classes produce every sample the probe reads (`dsv4_engine.probe.evidence`).

Run as a script in its own process (SGLang's runtime context, plugins and its multiprocess
Prometheus directory are process-wide).  Arguments: MODEL_DIR DISAGGREGATION_MODE DEVICE
HOST (the finished request's prompt tokens found on device, and loaded back from host).

What happens is what a serving engine does, with the GPU-only parts left out:

- ``set_prometheus_multiproc_dir()`` first (SGLang does, before prometheus_client is
  imported), then ``load_plugins()`` as every engine process does;
- its server arguments published (``--enable-metrics``, the disaggregation mode) and its
  tokenizer's metrics collector built with SGLang's own labels
  (``tokenizer_metric_labels``), which counts the finished request exactly as
  ``TokenizerManager.collect_metrics`` hands it over;
- SGLang's kv-canary `ViolationReporter` constructed, as its canary manager does with
  ``--kv-canary`` on (the plugin's AFTER hook marks the engine armed);
- the page rendered as SGLang's /metrics route renders it (``add_prometheus_middleware``:
  a multiprocess collector over a fresh registry).
"""

from __future__ import annotations

import sys

import torch

torch.cuda.get_device_capability = lambda *a, **k: (9, 0)  # resolving args, no GPU here


def main() -> None:
    model_dir, mode, device, host = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    from sglang.srt.utils.common import set_prometheus_multiproc_dir

    set_prometheus_multiproc_dir()
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.srt import runtime_context
    from sglang.srt.server_args import ServerArgs

    sa = ServerArgs(
        model_path=model_dir,
        device="cuda",
        served_model_name="deepseek-v4-flash",
        enable_metrics=True,
        disaggregation_mode=mode,
        kv_canary="log",
    )
    runtime_context.publish(sa, role="scheduler")
    from sglang.srt.observability.metrics_collector import (
        TokenizerMetricsCollector,
        tokenizer_metric_labels,
    )

    labels = tokenizer_metric_labels()
    collector = TokenizerMetricsCollector(server_args=sa, labels=labels)
    collector.observe_one_finished_request(
        labels,
        prompt_tokens=device + host + 17,
        generation_tokens=8,
        cached_tokens=device + host,
        e2e_latency=0.5,
        has_grammar=False,
        cached_tokens_details={"device": device, "host": host},
    )
    from sglang.srt.kv_canary.runner.violation_reporter import ViolationReporter

    ViolationReporter(config=None, device_state=None)  # stored, not read, by its __init__
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    sys.stdout.write(generate_latest(registry).decode())


if __name__ == "__main__":
    main()
