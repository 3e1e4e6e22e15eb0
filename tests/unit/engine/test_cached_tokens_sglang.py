"""Where a probe's host-tier count comes from on SGLang 0.5.23, on its own classes (real
imports, no copy): the scheduler splits a request's cached prefix by tier into
`Req.cached_tokens_host` (the tokens it loaded back from host), the output streamer hands
that on as ``{"device", "host"}``, and the OpenAI server answers it as
``sglext.cached_tokens_details`` when — and only when — the request sets
``return_cached_tokens_details``, as every probe request does.  The probe reads exactly
that shape back."""

from __future__ import annotations

import importlib.util
import inspect
import json
from array import array
from pathlib import Path

import pytest

from dsv4_engine.probe.client import host_tokens
from dsv4_engine.probe.probes import ProbeContext
from dsv4_engine.probe.settings import ProbeSettings

pytestmark = pytest.mark.sglang

DEVICE, HOST = 256, 384  # prompt tokens found on device, and loaded back from host


@pytest.fixture(scope="module")
def finished_req():
    """A request as the scheduler leaves it after a host-tier hit: the radix match
    promised HOST tokens on host (`host_hit_length`), `init_load_back` loaded them
    (`host_loaded_length`, schedule_policy.py) and they joined the device prefix
    (`prefix_len`); then the batch split the cached prefix by tier, as
    `ScheduleBatch.prepare_for_extend` does."""
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch, split_cached_prefix_by_tier
    from sglang.srt.sampling.sampling_params import SamplingParams

    source = inspect.getsource(ScheduleBatch.prepare_for_extend)
    assert "split_cached_prefix_by_tier(" in source
    assert "host_hit_len=req.materialized_host_hit_len()" in source
    assert "req.cached_tokens_host," in source
    req = Req("probe-sample", "", array("i", range(DEVICE + HOST + 8)), SamplingParams())
    req.host_hit_length = req.host_loaded_length = HOST
    req.prefix_len = DEVICE + HOST
    req.cached_tokens_device, req.cached_tokens_host, req.cached_tokens_storage = (
        split_cached_prefix_by_tier(
            prefix_len=req.prefix_len,
            host_hit_len=req.materialized_host_hit_len(),
            storage_hit_len=req.storage_hit_length,
            storage_hit_start=req.storage_hit_start,
            host_hit_is_storage=req.host_hit_is_storage,
        )
    )
    return req


def _details(req) -> dict | None:
    """What the scheduler sends on for ``req`` (no L3 storage backend attached)."""
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.scheduler_components.output_streamer import (
        SchedulerOutputStreamer,
    )
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    streamer = SchedulerOutputStreamer(
        send_to_detokenizer=None,  # the socket, tree and args are not read for this
        tree_cache=None,
        server_args=None,
        is_generation=True,
        spec_algorithm=SpeculativeAlgorithm.NONE,
        disaggregation_mode=DisaggregationMode.NULL,
        enable_hicache_storage=lambda: False,
    )
    return streamer.get_cached_tokens_details(req)


def _response_json(body: dict, details: dict | None) -> dict:
    """The JSON of SGLang's non-streaming chat response to ``body`` (`OpenAIServingChat`
    builds its `sglext` from the first output's meta_info like this)."""
    from sglang.srt.entrypoints.openai.protocol import (
        ChatCompletionRequest,
        ChatCompletionResponse,
        ChatCompletionResponseChoice,
        ChatMessage,
        SglExt,
        UsageInfo,
    )
    from sglang.srt.entrypoints.openai.utils import process_cached_tokens_details_from_ret

    # serving_chat itself needs FastAPI, which the test venv does not carry: its source.
    serving_chat = importlib.util.find_spec("sglang.srt.entrypoints.openai.serving_chat")
    assert serving_chat is not None and serving_chat.origin is not None
    source = Path(serving_chat.origin).read_text()
    build = source[source.index("def _build_chat_response(") :]
    build = build[: build.index("\n    def ")]
    assert "process_cached_tokens_details_from_ret(\n            first_ret, request" in build
    assert "cached_tokens_details=cached_tokens_details," in build
    assert "sglext=response_sglext," in build
    request = ChatCompletionRequest.model_validate(body)
    ret = {"meta_info": {"cached_tokens_details": details}}
    cached = process_cached_tokens_details_from_ret(ret, request)
    response = ChatCompletionResponse(
        id="chatcmpl-1",
        model=request.model,
        choices=[
            ChatCompletionResponseChoice(
                index=0, message=ChatMessage(role="assistant", content="ok"), finish_reason="stop"
            )
        ],
        usage=UsageInfo(prompt_tokens=DEVICE + HOST + 8, completion_tokens=1, total_tokens=1),
        sglext=SglExt(cached_tokens_details=cached) if cached is not None else None,
    )
    return json.loads(json.dumps(response.model_dump(mode="json")))


def _probe_body() -> dict:
    """A probe's chat request body, as every sample sends it."""
    ctx = ProbeContext(client=None, settings=ProbeSettings(base_url="http://x"), model="m")  # type: ignore[arg-type]
    return ctx.body([{"role": "user", "content": "hi"}], 8, tools=True)


def test_the_host_count_is_the_tokens_the_request_loaded_back(finished_req):
    assert (finished_req.cached_tokens_device, finished_req.cached_tokens_host) == (DEVICE, HOST)
    assert _details(finished_req) == {"device": DEVICE, "host": HOST}


def test_the_probe_reads_the_host_count_from_sglangs_response(finished_req):
    body = _probe_body()
    reply = _response_json(body, _details(finished_req))
    assert reply["sglext"] == {"cached_tokens_details": {"device": DEVICE, "host": HOST}}
    assert host_tokens(reply) == HOST


def test_unasked_or_uncached_there_is_no_count():
    """Without the request field SGLang answers no details, and with nothing cached it
    has none to give (`sglext` left out): the probe counts no host-tier read."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    body = _probe_body()
    unasked = {k: v for k, v in body.items() if k != "return_cached_tokens_details"}
    cold = Req("cold", "", array("i", range(16)), SamplingParams())
    assert _details(cold) is None
    for reply in (
        _response_json(unasked, {"device": DEVICE, "host": HOST}),
        _response_json(body, None),
    ):
        assert "sglext" not in reply and host_tokens(reply) == 0


def test_flush_cache_empties_the_host_tier_too_so_it_cannot_force_a_host_read():
    """Why the probe has no SGLang offload call (`settings.DEFAULT_ADMIN_OFFLOAD_PATH`):
    `/flush_cache` resets the whole radix cache, host pool included, and only when no
    request runs — nothing is left on host for the next request to read back."""
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    reset = inspect.getsource(UnifiedRadixCache._reset_full)
    assert "self.cache_controller.mem_pool_host.clear()" in reset
    scheduler = importlib.util.find_spec("sglang.srt.managers.scheduler")
    assert scheduler is not None and scheduler.origin is not None
    source = Path(scheduler.origin).read_text()
    flush = source[source.index("    def flush_cache(") :]
    flush = flush[: flush.index("\n    def ")]
    assert "if self.is_fully_idle(" in flush and "self.tree_cache.reset()" in flush
