"""A development fallback for sglang-router: a minimal PD router in front of reference
prefill and decode servers, for working on the engines without the router the operator
deploys.  No default path uses it: every deployment, test and the demo run sglang-router
0.3.2 (`python3 -m sglang_router.launch_router`), which this imitates only as far as the
engines and the probe see it:

- each request goes to *both* a prefill and a decode server, on the route it came in on,
  with `bootstrap_host`, `bootstrap_port` and a random `bootstrap_room` added (the
  servers hand the prompt's pages over through the room: `pd`); the decode's answer is the
  client's, the prefill's must succeed;
- ``GET /engine_metrics`` is every worker's /metrics in sglang-router's spelling
  (`dsv4_engine.engine_metrics.labelled`);
- ``POST /admin/hicache/offload`` reaches every prefill server: the reference-only test
  knob, which sglang-router does not route (no such call exists in SGLang).

Round robin over the workers it was started with; no discovery, no health checks.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from dsv4_engine.engine_metrics import labelled

PROXY_TIMEOUT_S = 600.0
_ROOMS = random.SystemRandom()


@dataclass(frozen=True)
class PrefillWorker:
    url: str
    bootstrap_port: int

    @property
    def host(self) -> str:
        return urlsplit(self.url).hostname or "127.0.0.1"


class Router:
    def __init__(self, prefills: list[PrefillWorker], decodes: list[str]) -> None:
        if not prefills or not decodes:
            raise ValueError("a PD router needs at least one --prefill and one --decode")
        self._http: aiohttp.ClientSession | None = None
        self.prefills = prefills
        self.decodes = [d.rstrip("/") for d in decodes]
        self._next_prefill = itertools.cycle(prefills)
        self._next_decode = itertools.cycle(self.decodes)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/engine_metrics", self._engine_metrics)
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_post("/admin/hicache/offload", self._offload)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _: web.Application) -> None:
        timeout = aiohttp.ClientTimeout(total=PROXY_TIMEOUT_S)
        self._http = aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0))

    async def _close(self, _: web.Application) -> None:
        if self._http is not None:
            await self._http.close()

    @property
    def http(self) -> aiohttp.ClientSession:
        assert self._http is not None
        return self._http

    @property
    def _workers(self) -> list[str]:
        return [p.url for p in self.prefills] + self.decodes

    async def _health(self, _: web.Request) -> web.Response:
        for url in self._workers:
            try:
                async with self.http.get(f"{url}/health") as resp:
                    if resp.status != 200:
                        return web.Response(status=503, text=f"{url}: HTTP {resp.status}")
            except aiohttp.ClientError as err:
                return web.Response(status=503, text=f"{url}: {err}")
        return web.Response(text="ok")

    async def _models(self, _: web.Request) -> web.Response:
        async with self.http.get(f"{self.decodes[0]}/v1/models") as resp:
            return web.Response(status=resp.status, body=await resp.read(),
                                content_type=resp.content_type)  # fmt: skip

    async def _engine_metrics(self, _: web.Request) -> web.Response:
        pages = []
        for url in self._workers:
            try:
                async with self.http.get(f"{url}/metrics") as resp:
                    if resp.status == 200:
                        pages.append(labelled(await resp.text(), url))
            except aiohttp.ClientError:
                pass  # sglang-router leaves out a worker it cannot read, too
        return web.Response(text="".join(pages), content_type="text/plain", charset="utf-8")

    async def _offload(self, _: web.Request) -> web.Response:
        total = 0
        for p in self.prefills:
            async with self.http.post(f"{p.url}/admin/hicache/offload", json={}) as resp:
                if resp.status != 200:
                    return web.Response(status=resp.status, body=await resp.read())
                total += (await resp.json()).get("offloaded_tokens", 0)
        return web.json_response({"offloaded_tokens": total})

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return web.json_response(
                {"error": {"message": "body: expected a JSON object"}}, status=400
            )
        prefill = next(self._next_prefill)
        body["bootstrap_host"], body["bootstrap_port"] = prefill.host, prefill.bootstrap_port
        body["bootstrap_room"] = _ROOMS.getrandbits(63)
        prefilled = asyncio.create_task(self._prefill(f"{prefill.url}{request.path}", body))
        target = f"{next(self._next_decode)}{request.path}"
        resp = web.StreamResponse()
        try:
            async with self.http.post(target, json=body) as upstream:
                failed = await prefilled
                if failed is not None:
                    return web.json_response({"error": {"message": failed}}, status=502)
                resp.set_status(upstream.status)
                resp.content_type = upstream.content_type
                await resp.prepare(request)
                async for data in upstream.content.iter_any():
                    await resp.write(data)
                await resp.write_eof()
        except aiohttp.ClientError as err:
            if resp.prepared:
                if isinstance(err, ConnectionResetError):
                    return resp  # the client left mid-answer: no one to answer
                raise  # the decode server broke off: cutting the answer short is all that is left
            message = f"decode server {target}: {err or type(err).__name__}"
            return web.json_response({"error": {"message": message}}, status=502)
        finally:
            if not prefilled.done():
                prefilled.cancel()
        return resp

    async def _prefill(self, url: str, body: dict) -> str | None:
        """Why the prefill server's side of a request failed, or None."""
        try:
            async with self.http.post(url, json=body) as resp:
                text = await resp.text()
                return (
                    None
                    if resp.status == 200
                    else f"prefill server {url}: HTTP {resp.status}: {text[:200]}"
                )
        except aiohttp.ClientError as err:
            return f"prefill server {url}: {err or type(err).__name__}"
