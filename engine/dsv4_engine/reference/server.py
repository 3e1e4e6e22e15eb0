"""The reference engine's HTTP server (aiohttp): OpenAI API, /health, /metrics, the info
routes SGLang serves, and the reference-only host-tier offload (a test knob).

Handlers never touch engine state: they submit requests to the engine thread and await
tokens it hands back through `loop.call_soon_threadsafe`.  In PD mode both servers get
every request, as sglang-router sends it (`pd`): the prefill server prefills it and hands
its pages over through the request's `bootstrap_room`, then answers (no generated text,
as SGLang's prefill answers); the decode server takes the pages from the prefill server
named in the request (`bootstrap_host` / `bootstrap_port`) and generates the answer.

Every chat answer to a request that offered tools is judged off the response path
(`dsv4_engine.live_judge`) by the server whose answer the user receives: a unified or PD
decode server.  A PD prefill server judges nothing: its answer carries no generated text
(`_prefill_answer`), and the router gives the user the decode server's.
"""

from __future__ import annotations

import asyncio
import codecs
import dataclasses
import importlib.metadata
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from dsv4_engine import live_judge
from dsv4_engine.pools.layout import BufferKind
from dsv4_engine.reference import metrics, openai_api, pd, tokenizer
from dsv4_engine.reference.engine import Engine, PrefilledState, Request
from dsv4_engine.reference.openai_api import BadRequest, Prompt
from dsv4_engine.reference.settings import DisaggregationMode, ServeSettings

# A reference-only test knob (SGLang 0.5.23 has no call that moves a prefix to the host
# tier): a probe uses it only when told to (`ProbeSettings.admin_offload_path`).
OFFLOAD_PATH = "/admin/hicache/offload"
# The live judge's redacted corrupt examples, served only when asked for (live_judge).
EXAMPLES_PATH = "/dsv4/live-judge/examples"
# How long a prefill whose request failed keeps its room for the decode to hear why.
FAILED_ROOM_WAIT_S = 10.0


class _Stream:
    """Tokens of one request, from the engine thread to the handler's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, streaming: bool, arrived: float) -> None:
        self.loop = loop
        self.streaming = streaming
        self.queue: asyncio.Queue[int | tuple[str, str | None]] = asyncio.Queue()
        self.finish_reason = "length"
        self.arrived = arrived  # time.monotonic() when the request reached the handler
        self.first_token_at: float | None = None  # set by the engine thread
        # Not streaming: tokens wait here and reach the loop with the end, in one wakeup
        # (a wakeup per token costs the engine thread a socket write per token).
        self._held: list[int] = []

    def on_token(self, token: int) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()
        if self.streaming:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, token)
        else:
            self._held.append(token)

    def on_done(self, reason: str, error: str | None) -> None:
        items: list[int | tuple[str, str | None]] = [*self._held, (reason, error)]
        self._held = []
        self.loop.call_soon_threadsafe(lambda: [self.queue.put_nowait(i) for i in items])

    @property
    def time_to_first_token(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.arrived

    async def tokens(self) -> AsyncIterator[int]:
        while True:
            item = await self.queue.get()
            if isinstance(item, tuple):
                reason, error = item
                if error is not None:
                    raise web.HTTPInternalServerError(
                        text=json.dumps(openai_api.error_body(error, "server_error", 500)),
                        content_type="application/json",
                    )
                self.finish_reason = reason
                return
            yield item


class ReferenceServer:
    def __init__(self, settings: ServeSettings, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        self.model = settings.served_model_name
        # How this engine lays out the pages a PD transfer moves (KV rows are bf16 in its
        # pools); another build may lay them out anew.
        self.transfer_format = pd.TransferFormat(
            index_dtype=settings.index_dtype.value,
            kv_dtype="bf16",
            page_size=settings.page_size,
            build=f"dsv4-engine {importlib.metadata.version('dsv4-engine')}",
        )
        self.rooms = pd.Rooms()  # a prefill server's hand-overs, by bootstrap room
        self.served = metrics.ServedCounts()
        self.first_token = metrics.FirstTokenTimes()
        self.judge = self._live_judge()

    def _live_judge(self) -> live_judge.LiveJudge | None:
        """The judge of this server's tool-call answers: none on a PD prefill server (its
        answers carry no text), nor with `live_judge.SWITCH_ENV` off."""
        if self.mode is DisaggregationMode.PREFILL or not live_judge.enabled():
            return None
        return live_judge.LiveJudge(
            tokenizer.TOOL_CALL_FORMAT,
            revision=live_judge.revision(),
            role=self.mode.engine_type,
            examples=live_judge.examples_kept(),
        )

    def _judge(self, body: dict[str, Any], message: dict[str, Any], reason: str | None,
               completion_tokens: int) -> None:  # fmt: skip
        """Hand one served chat answer to the live judge (queued: returns at once)."""
        if self.judge is not None and live_judge.offers_tools(
            body.get("tools"), body.get("tool_choice")
        ):
            self.judge.submit(
                live_judge.Answer(
                    message, reason, body["tools"], body.get("messages"), completion_tokens
                )
            )

    @property
    def mode(self) -> DisaggregationMode:
        return self.settings.disaggregation_mode

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self._health)
        app.router.add_get("/health_generate", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/model_info", self._model_info)
        app.router.add_get("/get_model_info", self._model_info)
        app.router.add_get("/server_info", self._server_info)
        app.router.add_get("/get_server_info", self._server_info)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        if self.engine.hicache is not None:
            app.router.add_post(OFFLOAD_PATH, self._offload)
        if self.judge is not None and self.judge.examples.maxlen:
            app.router.add_get(EXAMPLES_PATH, self._examples)
        return app

    # -- info -----------------------------------------------------------------------------

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _models(self, _: web.Request) -> web.Response:
        card = {"id": self.model, "object": "model", "owned_by": "dsv4-reference"}
        return web.json_response({"object": "list", "data": [card]})

    async def _model_info(self, _: web.Request) -> web.Response:
        """SGLang 0.5.23's `/model_info` keys (entrypoints/http_server.py `model_info`) as far
        as sglang-router's worker registration and a probe read them."""
        info = {
            "model_path": self.settings.model_path or self.model,
            "served_model_name": self.model,
            "tokenizer_path": self.settings.model_path or self.model,
            "is_generation": True,
            "disaggregation_mode": self.mode.value,
            "model_type": "deepseek_v4",
            "architectures": ["DeepseekV4ForCausalLM"],
        }
        return web.json_response(info)

    async def _server_info(self, _: web.Request) -> web.Response:
        """SGLang's `/server_info` shape: its server arguments at the top level (those this
        engine shares with SGLang, by SGLang's names), the pool it sized, and the reference
        engine's own facts beside them."""
        args = {k: str(v) if not isinstance(v, int | float | bool | None) else v
                for k, v in dataclasses.asdict(self.settings).items()}  # fmt: skip
        info = {
            **args,
            "max_total_num_tokens": self.settings.device_pages * self.settings.page_size,
            "version": importlib.metadata.version("dsv4-engine"),
            "deterministic": not self.settings.benign_nondeterminism,
            "reference_model": self.settings.reference_model.value,
            "index_k_gated": not self.engine.pool.ungated_index_k,
            "kernel_backend": self.engine.pool.ops.backend,
        }
        return web.json_response(info)

    async def _metrics(self, _: web.Request) -> web.Response:
        pool = self.engine.pool
        host = self.engine.hicache.host.num_pages if self.engine.hicache is not None else None
        text = metrics.render(
            metrics.Page(
                stats=self.engine.stats,
                served=self.served,
                model=self.model,
                engine_type=self.mode.engine_type,
                page_size=self.settings.page_size,
                total_pages=self.settings.device_pages,
                host_pages=host,
                gate_waits=pool.gate.waits,
                gate_blocked=pool.gate.blocked,
                gated=not pool.ungated_index_k,
                stale_index_k_reads=pool.stale_reads(BufferKind.INDEX_K),
                kv_canary_violations=None
                if self.settings.kv_canary == "none"
                else {
                    f"{k.name}_READ": pool.stale_reads(k)
                    for k in (BufferKind.INDEX_K, BufferKind.KV)
                },
                live=live_judge.render(self.judge) if self.judge is not None else (),
                first_token=None if self.mode is DisaggregationMode.PREFILL else self.first_token,
            )
        )
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def _examples(self, _: web.Request) -> web.Response:
        assert self.judge is not None
        return web.json_response(self.judge.recent_examples())

    async def _offload(self, request: web.Request) -> web.Response:
        body = await _json(request)
        if body is None:
            return _error("body: expected a JSON object ({})")
        tokens = await asyncio.wrap_future(self.engine.call(self.engine.offload))
        return web.json_response({"offloaded_tokens": tokens})

    async def prefill(self, prompt: list[int]) -> PrefilledState:
        """PD prefill: run the prompt (prefix cache and HiCache included), export its pages."""
        if (too_big := self.engine.check_fits(len(prompt), 1)) is not None:
            raise BadRequest(too_big)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[PrefilledState] = loop.create_future()

        def settle(result: PrefilledState | None, error: str | None) -> None:
            if fut.done():
                return
            if error is not None:
                fut.set_exception(RuntimeError(error))
            elif result is not None:
                fut.set_result(result)

        self.engine.submit(
            Request(
                prompt,
                1,
                lambda _: None,
                lambda _, err: loop.call_soon_threadsafe(settle, None, err),
                prefill_only=True,
                on_exported=lambda st: loop.call_soon_threadsafe(settle, st, None),
            )
        )
        return await fut

    async def _prefill_answer(
        self, body: dict[str, Any], prompt: Prompt, chat: bool, request: web.Request
    ) -> web.StreamResponse:
        """A PD prefill server's answer to a routed request: prefill it, hand its pages to
        the decode server that names the same `bootstrap_room`, then answer with no text
        (finish_reason `length`), as SGLang's prefill does once its transfer is done."""
        room = pd.bootstrap_room(body)
        if room is None:
            return _error(
                "bootstrap_room: a prefill server serves requests routed to it with their "
                "bootstrap room (send requests through the PD router)"
            )
        try:
            self.rooms.open(room, pd.prompt_digest(prompt.ids))
        except ValueError as err:
            return _error(str(err))
        try:
            state = await self.prefill(prompt.ids)
        except (BadRequest, RuntimeError) as err:
            # Told to the room's decode server too (if it comes soon), which answers 502.
            failed = f"prefill failed: {err}"
            self.rooms.fill(room, None, failed)
            await self.rooms.handed_over(room, FAILED_ROOM_WAIT_S)
            return _error(failed, 400 if isinstance(err, BadRequest) else 500)
        self.rooms.fill(room, state)
        if (why := await self.rooms.handed_over(room)) is not None:
            return _error(why, 500)
        self.served.count(state.cached_tokens, state.host_tokens)
        use = openai_api.usage(len(prompt.ids), 0, state.cached_tokens)
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": ""}}
        else:
            choice = {"index": 0, "text": ""}
        kind = "chat.completion" if chat else "text_completion"
        answer = openai_api.envelope(kind, self.model, [{**choice, "finish_reason": "length"}],
                                     usage=use)  # fmt: skip
        if not prompt.stream:
            return web.json_response(answer)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(f"data: {json.dumps(answer)}\n\ndata: [DONE]\n\n".encode())
        await resp.write_eof()
        return resp

    # -- generation -----------------------------------------------------------------------

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        arrived = time.monotonic()
        body = await _json(request)
        if body is None:
            return _error("body: expected a JSON object")
        try:
            prompt = openai_api.chat_prompt(body) if chat else openai_api.completion_prompt(body)
        except BadRequest as err:
            return _error(str(err))
        if self.mode is DisaggregationMode.PREFILL:
            return await self._prefill_answer(body, prompt, chat, request)
        try:
            prefilled = await self._prefilled(body, prompt)
        except BadRequest as err:
            return _error(str(err))
        except pd.FormatMismatch as err:
            self.engine.stats.transfer_format_mismatches += 1
            return _error(str(err), 502)
        except pd.TransferError as err:
            return _error(str(err), 502)
        too_big = self.engine.check_fits(len(prompt.ids), prompt.max_tokens)
        if too_big is not None:
            return _error(too_big)
        stream = _Stream(asyncio.get_running_loop(), prompt.stream, arrived)
        req = Request(
            prompt.ids, prompt.max_tokens, stream.on_token, stream.on_done, prefilled=prefilled
        )
        self.engine.submit(req)
        if prompt.stream:
            return await self._stream_out(request, stream, chat, body, req)
        try:
            ids = [t async for t in stream.tokens()]
        except web.HTTPException as err:
            return web.Response(status=err.status, text=err.text, content_type="application/json")
        self.served.count(req.cached_tokens, req.host_tokens)
        self._first_token(stream)
        text = tokenizer.decode(ids)
        use = openai_api.usage(len(prompt.ids), len(ids), req.cached_tokens)
        if chat:
            message = openai_api.chat_message(text, bool(body.get("tools")))
            reason = "tool_calls" if message.get("tool_calls") else stream.finish_reason
            choice = {"index": 0, "message": message, "finish_reason": reason}
            self._judge(body, message, reason, len(ids))
            kind = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "finish_reason": stream.finish_reason}
            kind = "text_completion"
        extra = {"usage": use}
        if (ext := openai_api.sglext(body, req.cached_tokens, req.host_tokens)) is not None:
            extra["sglext"] = ext
        return web.json_response(openai_api.envelope(kind, self.model, [choice], **extra))

    def _first_token(self, stream: _Stream) -> None:
        """A finished request's time to first token, counted as SGLang counts it."""
        if (seconds := stream.time_to_first_token) is not None:
            self.first_token.observe(seconds, stream.streaming)

    async def _prefilled(self, body: dict[str, Any], prompt: Prompt) -> PrefilledState | None:
        if self.mode is not DisaggregationMode.DECODE:
            return None
        host, port = body.get("bootstrap_host"), body.get("bootstrap_port")
        room = pd.bootstrap_room(body)
        if not isinstance(host, str) or not isinstance(port, int) or room is None:
            raise BadRequest(
                "bootstrap_host/bootstrap_port/bootstrap_room: a decode server needs the "
                "prefill server and room of the request (send requests through the PD router)"
            )
        return await pd.fetch_prefill(host, port, room, prompt.ids, self.transfer_format)

    async def _stream_out(
        self,
        request: web.Request,
        stream: _Stream,
        chat: bool,
        body: dict[str, Any],
        req: Request,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        kind = "chat.completion.chunk" if chat else "text_completion"
        # With tools, the answer's DSML block goes out as `tool_calls` deltas, as SGLang's
        # tool-call parser streams it; without, every piece is content.
        calls = openai_api.ToolCallStream() if chat and body.get("tools") else None
        # What the client joins from the deltas: the answer judged (with tools only).
        joined = live_judge.StreamedMessage() if calls is not None and self.judge else None

        async def write(delta: dict[str, Any]) -> None:
            choice = {"index": 0, "delta": delta} if chat else {"index": 0, **delta}
            if joined is not None:
                joined.add_choice(choice)
            chunk = openai_api.envelope(kind, self.model, [choice])
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())

        async def send(piece: str) -> None:
            if not piece:
                return
            if calls is not None:
                for delta in calls.feed(piece):
                    await write(delta)
            else:
                await write({"content": piece} if chat else {"text": piece})

        # A character can span tokens: decode incrementally, as `tokenizer.decode` does
        # all at once, so the streamed pieces join to the non-streamed text.
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        generated = 0
        try:
            async for token in stream.tokens():
                generated += 1
                await send(decoder.decode(tokenizer.token_bytes(token)))
            await send(decoder.decode(b"", final=True))
            for delta in calls.end() if calls is not None else []:
                await write(delta)
            self.served.count(req.cached_tokens, req.host_tokens)
            self._first_token(stream)
            reason = "tool_calls" if calls is not None and calls.called else stream.finish_reason
            end = {"delta": {}} if chat else {"text": ""}
            last = {"index": 0, **end, "finish_reason": reason}
            await resp.write(
                f"data: {json.dumps(openai_api.envelope(kind, self.model, [last]))}\n\n".encode()
            )
            if joined is not None:
                self._judge(body, joined.message(), reason, generated)
            # SGLang streams the usage (asked with `stream_options.include_usage`, as
            # OpenAI's API) and `sglext` last, in a chunk of their own with no choices.
            extra: dict[str, Any] = {}
            if (body.get("stream_options") or {}).get("include_usage"):
                extra["usage"] = openai_api.usage(len(req.prompt), generated, req.cached_tokens)
            if (ext := openai_api.sglext(body, req.cached_tokens, req.host_tokens)) is not None:
                extra["sglext"] = ext
            if extra:
                chunk = openai_api.envelope(kind, self.model, [], **extra)
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        except web.HTTPException as err:
            await resp.write(f"data: {err.text}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


async def _json(request: web.Request) -> dict[str, Any] | None:
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError):
        return None
    return body if isinstance(body, dict) else None


def _error(message: str, status: int = 400) -> web.Response:
    kind = "invalid_request_error" if status == 400 else "server_error"
    return web.json_response(openai_api.error_body(message, kind, status), status=status)
