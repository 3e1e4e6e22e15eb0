"""The HTTP surface in-process (aiohttp test server): what an OpenAI client sees."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp.test_utils import TestClient, TestServer

from dsv4_engine import kv_canary
from dsv4_engine.probe.client import joined
from dsv4_engine.reference.engine import Engine, Request
from dsv4_engine.reference.server import ReferenceServer
from dsv4_engine.reference.settings import DisaggregationMode, ServeSettings

LABELS = 'model_name="dsv4-reference",engine_type="unified"'
CHAT = {"messages": [{"role": "user", "content": "Say something."}], "max_tokens": 5}


def with_client(settings: ServeSettings, scenario) -> None:
    async def main() -> None:
        engine = Engine(settings)
        engine.start()
        try:
            async with TestClient(TestServer(ReferenceServer(settings, engine).app())) as client:
                await scenario(client)
        finally:
            engine.stop()

    asyncio.run(main())


def test_chat_stream_and_completion_agree():
    async def scenario(client: TestClient) -> None:
        resp = await client.post("/v1/chat/completions", json=CHAT)
        body = await resp.json()
        text = body["choices"][0]["message"]["content"]
        assert resp.status == 200 and len(text) == 5
        assert body["usage"]["completion_tokens"] == 5
        assert body["choices"][0]["finish_reason"] == "length"
        resp = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        events = [ln[6:] for ln in (await resp.text()).splitlines() if ln.startswith("data: ")]
        assert events[-1] == "[DONE]"
        pieces = [
            json.loads(e)["choices"][0].get("delta", {}).get("content", "") for e in events[:-1]
        ]
        assert "".join(pieces) == text
        resp = await client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 3})
        assert resp.status == 200 and len((await resp.json())["choices"][0]["text"]) == 3

    with_client(ServeSettings(), scenario)


def test_models_info_metrics_and_errors():
    async def scenario(client: TestClient) -> None:
        models = await (await client.get("/v1/models")).json()
        assert models["data"][0]["id"] == "dsv4-reference"
        info = await (await client.get("/server_info")).json()
        assert info["deterministic"] is True and info["index_k_gated"] is True
        resp = await client.post("/v1/chat/completions", json={"messages": "hi"})
        assert resp.status == 400 and "messages" in (await resp.json())["error"]["message"]
        resp = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 10**6})
        assert resp.status == 400 and "--context-length" in (await resp.json())["error"]["message"]
        # No host tier, no offload endpoint: probes then report consistency as N/A.
        assert (await client.post("/admin/hicache/offload", json={})).status == 404
        await client.post("/v1/chat/completions", json=CHAT)
        metrics = await (await client.get("/metrics")).text()
        assert f"sglang:generation_tokens_total{{{LABELS}}} 5" in metrics
        assert "sglang:cache_hit_rate" in metrics and "dsv4:index_k_gated" in metrics
        assert f"sglang:max_total_num_tokens{{{LABELS}}} 131072" in metrics

    with_client(ServeSettings(), scenario)


def test_the_info_routes_answer_what_sglang_router_and_the_probe_read():
    """sglang-router registers a worker with GET /health, /server_info, /model_info; the
    keys it reads (`served_model_name`, `model_path`, `disaggregation_mode`) are where
    SGLang 0.5.23 puts them: its server arguments flat at the top of /server_info (with the
    pool it sized), and /model_info's own (entrypoints/http_server.py)."""

    async def scenario(client: TestClient) -> None:
        info = await (await client.get("/server_info")).json()
        assert info["served_model_name"] == "dsv4-reference"
        assert info["disaggregation_mode"] == "prefill" and info["max_total_num_tokens"] == 8192
        assert (await (await client.get("/get_server_info")).json()) == info
        model = await (await client.get("/model_info")).json()
        assert model["served_model_name"] == "dsv4-reference" and model["is_generation"] is True
        assert model["disaggregation_mode"] == "prefill"
        assert (await (await client.get("/get_model_info")).json()) == model
        assert (await client.get("/health")).status == 200

    with_client(
        ServeSettings(disaggregation_mode=DisaggregationMode.PREFILL, max_total_tokens=8192),
        scenario,
    )


def test_offload_then_reload_is_counted():
    async def scenario(client: TestClient) -> None:
        chat = {**CHAT, "messages": [{"role": "system", "content": "x" * 400}, *CHAT["messages"]]}
        cold = await (await client.post("/v1/chat/completions", json=chat)).json()
        offload = await (await client.post("/admin/hicache/offload", json={})).json()
        assert offload["offloaded_tokens"] >= 384
        warm = await (await client.post("/v1/chat/completions", json=chat)).json()
        assert warm["choices"][0]["message"] == cold["choices"][0]["message"]
        assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] >= 384
        metrics = await (await client.get("/metrics")).text()
        assert f"sglang:load_back_tokens_total{{{LABELS}}} 384" in metrics
        offloaded = offload["offloaded_tokens"]
        assert f"dsv4:offloaded_tokens_total{{{LABELS}}} {offloaded}" in metrics

    with_client(ServeSettings(enable_hierarchical_cache=True, hicache_ratio=2), scenario)


def test_the_host_tier_tokens_of_an_answer_are_reported_as_sglang_does():
    """With `return_cached_tokens_details`, an answer says how much of its prompt came from
    the device cache and how much it loaded back from the host tier, in SGLang 0.5.23's
    place (`sglext.cached_tokens_details`, absent when nothing was cached); the host count
    is this request's share of `sglang:load_back_tokens_total`."""

    async def scenario(client: TestClient) -> None:
        system = {"role": "system", "content": "x" * 400}
        host = f'sglang:cached_tokens_total{{{LABELS},cache_source="host"}}'
        chat = {
            **CHAT,
            "messages": [system, *CHAT["messages"]],
            "return_cached_tokens_details": True,
        }
        cold = await (await client.post("/v1/chat/completions", json=chat)).json()
        assert "sglext" not in cold  # nothing was cached: SGLang leaves it out too
        hot = await (await client.post("/v1/chat/completions", json=chat)).json()
        cached = hot["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert hot["sglext"] == {"cached_tokens_details": {"device": cached, "host": 0}}
        await client.post("/admin/hicache/offload", json={})
        warm = await (await client.post("/v1/chat/completions", json=chat)).json()
        metrics = await (await client.get("/metrics")).text()
        assert f"sglang:load_back_tokens_total{{{LABELS}}} {cached}" in metrics
        assert warm["sglext"] == {"cached_tokens_details": {"device": 0, "host": cached}}
        # Counted per finished request, by tier, as SGLang's tokenizer counts it (the
        # probe's evidence through sglang-router, which drops the request field).
        assert f"{host} {cached}" in metrics
        await client.post("/admin/hicache/offload", json={})
        unasked = {k: v for k, v in chat.items() if k != "return_cached_tokens_details"}
        assert (
            "sglext" not in await (await client.post("/v1/chat/completions", json=unasked)).json()
        )

    with_client(ServeSettings(enable_hierarchical_cache=True, hicache_ratio=2), scenario)


class _ScriptedEngine:
    """Stands in for the engine: answers every request with the bytes of `text`, one token
    each (the reference model itself only emits ASCII, so it never splits a character)."""

    hicache = None

    def __init__(self, text: str) -> None:
        self.tokens = list(text.encode())

    def check_fits(self, prompt_len: int, max_new_tokens: int) -> None:
        return None

    def submit(self, req: Request) -> None:
        for token in self.tokens[: req.max_new_tokens]:
            req.on_token(token)
        req.on_done("length", None)


@pytest.mark.parametrize(("cut", "expected"), [(0, "héllo 稀疏 ✓"), (2, "héllo 稀疏 \ufffd")])
def test_streamed_pieces_join_to_the_text_when_characters_span_tokens(cut, expected):
    """A multi-byte character arrives over several tokens; max_tokens may cut one short."""
    engine = _ScriptedEngine("héllo 稀疏 ✓")
    body = {"prompt": "x", "max_tokens": len(engine.tokens) - cut}

    async def main() -> None:
        server = ReferenceServer(ServeSettings(), engine)  # type: ignore[arg-type]
        async with TestClient(TestServer(server.app())) as client:
            whole = await (await client.post("/v1/completions", json=body)).json()
            resp = await client.post("/v1/completions", json={**body, "stream": True})
            events = [ln[6:] for ln in (await resp.text()).splitlines() if ln.startswith("data: ")]
        pieces = [json.loads(e)["choices"][0]["text"] for e in events[:-1]]
        assert whole["choices"][0]["text"] == expected
        assert "".join(pieces) == expected

    asyncio.run(main())


def test_a_streamed_answer_ends_with_usage_and_sglext_in_a_chunk_of_its_own():
    """A streamed request asking for its usage (`stream_options.include_usage`) and for
    `return_cached_tokens_details`: SGLang streams both after the finish, in a chunk with
    no choices; the probe joins it into the answer."""
    long = {**CHAT, "messages": [{"role": "user", "content": "Say something. " * 40}]}
    asked = {
        **long,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_cached_tokens_details": True,
    }

    async def scenario(client: TestClient) -> None:
        whole = await (await client.post("/v1/chat/completions", json=long)).json()  # cached now
        resp = await client.post("/v1/chat/completions", json=asked)
        events = [ln[6:] for ln in (await resp.text()).splitlines() if ln.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        finish = [c for c in chunks if c["choices"] and c["choices"][0].get("finish_reason")]
        assert chunks.index(finish[-1]) == len(chunks) - 2
        assert chunks[-1]["choices"] == []
        details = chunks[-1]["sglext"]["cached_tokens_details"]
        assert details["device"] + details["host"] > 0
        reply = joined(chunks)
        assert reply["sglext"] == chunks[-1]["sglext"]
        assert reply["usage"] == chunks[-1]["usage"]
        assert reply["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]
        assert reply["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"]
        assert reply["choices"][0]["finish_reason"] == finish[-1]["choices"][0]["finish_reason"]

    with_client(ServeSettings(), scenario)


@pytest.mark.parametrize("mode", ["none", "log"])
def test_kv_canary_violations_are_served_only_with_kv_canary_on(mode):
    """Off (SGLang's `--kv-canary none`), /metrics has no kv-canary counter at all; on, it
    counts the pool's stale reads by buffer (here none: every read is gated)."""

    async def scenario(client: TestClient) -> None:
        await client.post("/v1/chat/completions", json=CHAT)
        page = await (await client.get("/metrics")).text()
        expected = {} if mode == "none" else {
            ("", "INDEX_K_READ", "load_not_landed"): 0,
            ("", "KV_READ", "load_not_landed"): 0,
        }  # fmt: skip
        assert kv_canary.read(page) == expected
        # On, the page vouches for the counter (`kv_canary.ARMED`); off, it cannot.
        assert (kv_canary.unread(page) is None) is (mode == "log")

    with_client(ServeSettings(kv_canary=mode), scenario)


def test_time_to_first_token_is_counted_as_sglang_counts_it():
    """`sglang:time_to_first_token_seconds` (SGLang's buckets, split by `is_streaming`):
    what `DSV4EngineSlowFirstToken` reads.  One request of each kind, each counted once."""
    from dsv4_engine.engine_metrics import named, samples
    from dsv4_engine.reference.metrics import TTFT, TTFT_BUCKETS

    async def scenario(client: TestClient) -> None:
        page = samples(await (await client.get("/metrics")).text())
        assert not named(page, f"{TTFT}_count"), "nothing answered yet"
        await client.post("/v1/chat/completions", json=CHAT)
        resp = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        await resp.text()
        page = samples(await (await client.get("/metrics")).text())
        counts = {s.labels["is_streaming"]: s.value for s in named(page, f"{TTFT}_count")}
        assert counts == {"false": 1, "true": 1}
        buckets = named(page, f"{TTFT}_bucket")
        assert {s.labels["le"] for s in buckets} == {*(str(float(b)) for b in TTFT_BUCKETS), "+Inf"}
        seconds = {s.labels["is_streaming"]: s.value for s in named(page, f"{TTFT}_sum")}
        assert all(0 < v < 60 for v in seconds.values()), seconds

    with_client(ServeSettings(), scenario)
