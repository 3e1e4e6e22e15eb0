"""Corruption probes: hammer an engine with requests that exercise the risky paths
(prefix-cache hits, host-tier reloads, long contexts, tool calls), judge every answer, and
return PASS / FAIL / INCONCLUSIVE with exact statistical confidence.

Pure Python plus an aiohttp client: nothing here imports torch, so the operator image and
its canary use it as is.

Python API (what the operator's canary calls)::

    from dsv4_engine.probe import ProbeSettings, run_probes, build_report
    result = await run_probes(ProbeSettings(base_url="http://canary:30000", backend="reference"))
    result.verdict          # Verdict.PASS | FAIL | INCONCLUSIVE  (.exit_code 0 | 1 | 2)
    result.rate, result.upper_bound, result.judged, result.corrupt, result.reasons
    build_report(result)    # the versioned JSON report (report_schema.json)

`run_probes` raises `ProbeConnectionError` when the engine cannot be reached at all.

HTTP contract the probes assume of the engine (OpenAI-compatible):

* ``GET /v1/models`` → ``{"data": [{"id": MODEL}, ...]}`` (preflight; first id is the default
  model; a 404 is accepted and the model is then ``--model`` or ``"default"``).  A refused
  connection or any other failure here is a connection error (exit 3).
* ``POST /v1/chat/completions`` with ``{"model", "messages", "max_tokens", "temperature": 0,
  "stream": false, "return_cached_tokens_details": true}`` and, for tool-call probes,
  ``"tools": [...], "tool_choice": "auto"`` →
  ``{"choices": [{"message": {"content", "tool_calls"?}, "finish_reason"}],
  "sglext"?: {"cached_tokens_details": {"device": D, "host": H}}}``.  The
  message may carry server-parsed ``tool_calls`` (SGLang ``--tool-call-parser``) or the raw
  DSML block in ``content``; both are judged.  ``H`` > 0 (prompt tokens read back from the
  host tier, as SGLang 0.5.23 reports them) makes the sample *exercised*; with
  ``hicache`` set, a PASS needs enough of those (`verdict.unexercised`).
* ``GET /server_info`` → a JSON object; the engine is deterministic when it holds
  ``"deterministic": true`` (reference engine) or ``enable_deterministic_inference: true``
  at top level or under ``"server_args"`` (SGLang).  Only asked when consistency probes run
  and ``deterministic`` is ``auto``; otherwise they are reported not applicable.
* ``GET /engine_metrics`` (a router's page of every engine's ``/metrics``, as sglang-router
  serves it) → Prometheus text; its ``dsv4:kv_canary_violations_total`` samples are the
  engines' kv-canary violations (`dsv4_engine.kv_canary`).  Only read with ``kv_canary``
  set, after the warm-up and after the last sample: any growth FAILs the run, a failed
  read leaves it INCONCLUSIVE.

Admin contract (reference engine; the path is the ``admin_offload_path`` setting, default
``/admin/hicache/offload``; SGLang has no equivalent, see `settings`):

* ``POST /admin/hicache/offload`` with body ``{}`` (JSON object; no fields yet).  The engine
  writes every cached prefix that is not in use by a running request to the host tier and
  frees its device copy, so the next request sharing that prefix loads it back from host
  (the HiCache reload path).  Reply ``200`` with an optional JSON object (e.g.
  ``{"offloaded_tokens": N}``) once the device copies are freed.  ``404``/``405`` means
  unsupported: consistency probes are then reported not applicable, never as corruption.
"""

from dsv4_engine.engine_config import Backend
from dsv4_engine.probe.dsml import DsmlFormat
from dsv4_engine.probe.outcome import Judgement, Outcome
from dsv4_engine.probe.report import build_report, report_schema, summary_table
from dsv4_engine.probe.runner import ProbeConnectionError, ProbeResult, probe, run_probes
from dsv4_engine.probe.settings import Determinism, ProbeName, ProbeSettings
from dsv4_engine.probe.validate import classify_chat_message, classify_completion
from dsv4_engine.probe.verdict import Verdict

__all__ = [
    "Determinism",
    "DsmlFormat",
    "Backend",
    "Judgement",
    "Outcome",
    "ProbeConnectionError",
    "ProbeName",
    "ProbeResult",
    "ProbeSettings",
    "Verdict",
    "build_report",
    "classify_chat_message",
    "classify_completion",
    "probe",
    "report_schema",
    "run_probes",
    "summary_table",
]
