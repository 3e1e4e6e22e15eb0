"""sglang-router 0.3.2, the real binary the operator deploys, started for a test; and a
recording stand-in for an SGLang worker behind it (the one mock: an SGLang server needs a
GPU), so a test sees exactly what the router sends and what it makes of the answers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from dsv4_dev.sglang_router import running, wait_for

__all__ = ["Worker", "get", "post", "router", "serving", "wait_for"]

router = running  # the real router, as tests start it


@dataclass
class Worker:
    """An SGLang worker as the router sees one: the registration routes (/health,
    /server_info, /model_info), /metrics (``page``) and chat completions, each answered as
    SGLang 0.5.23 answers them (non-streaming JSON with `usage`; a stream's `usage` in a
    last chunk of its own when asked), and every chat body recorded."""

    mode: str  # prefill | decode
    page: str = ""
    bodies: list[dict[str, Any]] = field(default_factory=list)
    content: str = "hello"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/server_info", self._server_info)
        app.router.add_get("/model_info", self._model_info)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/chat/completions", self._chat)
        return app

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(text=self.page)

    async def _server_info(self, _: web.Request) -> web.Response:
        return web.json_response(
            {
                "served_model_name": "deepseek-v4-flash",
                "model_path": "/models",
                "disaggregation_mode": self.mode,
                "tp_size": 1,
                "dp_size": 1,
            }  # fmt: skip
        )

    async def _model_info(self, _: web.Request) -> web.Response:
        return web.json_response(
            {
                "model_path": "/models",
                "served_model_name": "deepseek-v4-flash",
                "is_generation": True,
                "disaggregation_mode": self.mode,
                "model_type": "deepseek_v4",
                "architectures": ["DeepseekV4ForCausalLM"],
            }  # fmt: skip
        )

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        usage = {"prompt_tokens": 42, "completion_tokens": 1, "total_tokens": 43}
        if not body.get("stream"):
            message = {"role": "assistant", "content": self.content}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            return web.json_response({"id": "1", "object": "chat.completion",
                                      "choices": [choice], "usage": usage})  # fmt: skip
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunks = [{"choices": [{"index": 0, "delta": {"content": self.content}}]},
                  {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}]  # fmt: skip
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append({"choices": [], "usage": usage})
        for chunk in chunks:
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


@contextlib.contextmanager
def serving(*workers: Worker) -> Iterator[list[str]]:
    """``workers`` on loopback ports, served from an event loop of their own (a thread), so
    a test drives the router with blocking calls meanwhile; their base URLs."""
    loop = asyncio.new_event_loop()
    runners: list[web.AppRunner] = []

    async def start(worker: Worker) -> str:
        runner = web.AppRunner(worker.app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield [asyncio.run_coroutine_threadsafe(start(w), loop).result(10) for w in workers]
    finally:
        for runner in runners:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def post(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    """POST ``body`` as JSON; the status and the raw answer."""
    request = urllib.request.Request(
        url, json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
