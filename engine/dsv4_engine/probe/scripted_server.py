"""ScriptedCompletionServer: a loopback OpenAI-compatible server with scripted answers.

It stands in for an LLM — which cannot run on the CPU machines of CI — in the probe
client's tests and benchmark: it answers what a perfect model would (the requested echo call
in DSML, the same greedy text for the same prompt) and then damages a configured, seeded
fraction of answers, so the client's concurrency, error handling and statistics can be
checked against a known truth.  It is not an engine and judges nothing.

Which answers are damaged depends only on (seed, request content), never on arrival order,
so a test's outcome does not depend on scheduling.

Its host tier is a set of prompts: an offload moves every prompt answered since the last one
there, as does eviction when more prompts than `device_slots` were answered since (the
oldest first), and a request for a prompt found there "loads it back" and counts it as
SGLang does
(``sglang:cached_tokens_total{cache_source="host"}`` on the page a router's
``GET /engine_metrics`` serves, a character a token; every answer's
``usage.prompt_tokens`` counts the same way), so the probe's exercised count can be
checked too.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from dsv4_engine import kv_canary
from dsv4_engine.engine_metrics import spelled
from dsv4_engine.probe.client import ENGINE_METRICS_PATH
from dsv4_engine.probe.dsml import EOS, DsmlFormat
from dsv4_engine.probe.dsml_format import render_dsml
from dsv4_engine.probe.evidence import CACHED_TOKENS


def _chance(*key: object) -> float:
    digest = hashlib.sha256(":".join(map(str, key)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@dataclass
class ScriptedCompletionServer:
    corruption_rate: float = 0.0
    transport_error_rate: float = 0.0
    failing_requests: frozenset[int] = frozenset()
    """Chat requests, by arrival (1 = the first), answered with HTTP 500 whatever the rate."""
    latency_s: float = 0.0
    seed: int = 0
    fmt: DsmlFormat = DsmlFormat.V4
    parsed_tool_calls: bool = False
    """True: answer like SGLang with --tool-call-parser (OpenAI tool_calls); False: raw DSML."""
    deterministic: bool = True
    offload_endpoint: bool = True
    models_endpoint: bool = True
    server_info: dict[str, Any] | None = None
    """GET /server_info body; None: {"deterministic": <deterministic>}."""
    model: str = "scripted-model"
    kv_canary_violation_at: int | None = None
    """The chat request, by arrival, while which the engine's kv-canary counts a violation
    (`kv_canary.METRIC` on the router's GET /engine_metrics); None: it never does."""
    kv_canary_armed: bool = True
    """Its page says its kv-canary check runs (`kv_canary.ARMED`)."""
    engine_metrics_endpoint: bool = True
    host_tokens: int = 0
    """Prompt tokens read back from the host tier, as the page counts them."""
    device_slots: int | None = None
    """Prompts the device holds before the oldest is evicted to the host tier; None: all."""
    in_flight: int = 0
    max_in_flight: int = 0
    chat_requests: int = 0
    offloads: int = 0
    _seen: set[str] = field(default_factory=set)
    _on_device: dict[str, None] = field(default_factory=dict)  # oldest first
    _on_host: set[str] = field(default_factory=set)
    _runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        if self.models_endpoint:
            app.router.add_get("/v1/models", self._models)
        app.router.add_get("/server_info", self._server_info)
        app.router.add_post("/v1/chat/completions", self._chat)
        if self.offload_endpoint:
            app.router.add_post("/admin/hicache/offload", self._offload)
        if self.engine_metrics_endpoint:
            app.router.add_get(ENGINE_METRICS_PATH, self._engine_metrics)
        return app

    async def start(self, port: int = 0) -> str:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port, backlog=1024)
        await site.start()
        bound = self._runner.addresses[0][1]
        return f"http://127.0.0.1:{bound}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": self.model, "object": "model"}]}
        )

    async def _server_info(self, _: web.Request) -> web.Response:
        return web.json_response(self.server_info or {"deterministic": self.deterministic})

    async def _engine_metrics(self, _: web.Request) -> web.Response:
        """A page as sglang-router serves it (names with `_`, each sample's worker)."""
        at = self.kv_canary_violation_at
        count = int(at is not None and self.chat_requests >= at)
        worker = 'worker_addr="scripted",engine_type="unified"'
        lines = [
            f'{spelled(CACHED_TOKENS)}{{{worker},cache_source="host"}} {self.host_tokens}',
            f'{spelled(kv_canary.METRIC)}{{{worker},launch_tag="HEAD_K_FULL",'
            f'fail_reason="verify_chain_hash"}} {count}',
        ]
        if self.kv_canary_armed:
            lines.append(f"{spelled(kv_canary.ARMED)}{{{worker}}} 1")
        return web.Response(text="".join(f"{line}\n" for line in lines))

    async def _offload(self, _: web.Request) -> web.Response:
        self.offloads += 1
        self._on_host |= self._on_device.keys()
        self._on_device.clear()
        return web.json_response({"offloaded_tokens": 0})

    async def _chat(self, request: web.Request) -> web.Response:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            body = await request.json()
            self.chat_requests += 1
            if self.latency_s:
                await asyncio.sleep(self.latency_s)
            key = json.dumps(body["messages"], sort_keys=True)
            chance = _chance(self.seed, "transport", key, self.chat_requests)
            if self.chat_requests in self.failing_requests or chance < self.transport_error_rate:
                return web.Response(status=500, text="scripted internal error")
            if body.get("tools"):
                message = self._echo_answer(body["messages"][-1]["content"], key)
            else:
                message = {"role": "assistant", "content": self._greedy_answer(key)}
            reply: dict[str, Any] = {
                "id": "x",
                "object": "chat.completion",
                "model": self.model,
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": len(key)},  # a character a token
            }
            if key in self._on_host:
                self.host_tokens += len(key)
            self._on_host.discard(key)
            self._on_device.pop(key, None)
            self._on_device[key] = None
            while self.device_slots is not None and len(self._on_device) > self.device_slots:
                oldest = next(iter(self._on_device))
                del self._on_device[oldest]
                self._on_host.add(oldest)
            if body.get("stream"):
                return await self._stream(request, reply, body.get("stream_options") or {})
            return web.json_response(reply)
        finally:
            self.in_flight -= 1

    async def _stream(
        self, request: web.Request, reply: dict[str, Any], options: dict[str, Any]
    ) -> web.StreamResponse:
        """``reply`` as SGLang streams it: content, then each call's id and name, then its
        arguments, the finish, `usage` in a chunk of its own when asked, `[DONE]`."""
        choice = reply["choices"][0]
        message = choice["message"]
        deltas: list[dict[str, Any]] = []
        if message.get("content"):
            text = message["content"]
            deltas += [{"content": text[: len(text) // 2]}, {"content": text[len(text) // 2 :]}]
        for index, call in enumerate(message.get("tool_calls") or []):
            function = call["function"]
            head = {**call, "index": index, "function": {"name": function["name"], "arguments": ""}}
            deltas += [
                {"tool_calls": [head]},
                {
                    "tool_calls": [
                        {"index": index, "function": {"arguments": function["arguments"]}}
                    ]
                },
            ]
        chunks = [{"choices": [{"index": 0, "delta": d}]} for d in deltas]
        reason = "tool_calls" if message.get("tool_calls") else choice["finish_reason"]
        chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})
        if options.get("include_usage"):
            chunks.append({"choices": [], "usage": reply["usage"]})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for chunk in chunks:
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def _echo_answer(self, instruction: str, key: str) -> dict[str, Any]:
        args, _ = json.JSONDecoder().raw_decode(instruction[instruction.index("{") :])
        name = instruction.split("Call the tool ", 1)[1].split(" ", 1)[0]
        damaged = _chance(self.seed, "corrupt", key) < self.corruption_rate
        if damaged:
            args = dict(
                args,
                record_id=args["record_id"][:-1] + ("X" if args["record_id"][-1] != "X" else "Y"),
            )
        if self.parsed_tool_calls:
            call = {
                "id": "call_0",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
            return {"role": "assistant", "content": None, "tool_calls": [call]}
        return {"role": "assistant", "content": render_dsml(self.fmt, name, args) + EOS}

    def _greedy_answer(self, key: str) -> str:
        """The same words for the same prompt; a repeat is damaged at `corruption_rate`."""
        words = hashlib.sha256(key.encode()).hexdigest()
        if not self.deterministic:
            words += f" {self.chat_requests}"
        warm = key in self._seen
        self._seen.add(key)
        if warm and _chance(self.seed, "corrupt", key) < self.corruption_rate:
            return words[::-1]
        return words
