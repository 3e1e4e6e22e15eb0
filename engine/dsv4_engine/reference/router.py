"""A minimal PD router: each request goes to a decode server, told which prefill server
holds its prompt (`bootstrap_host` / `bootstrap_port`, SGLang's fields); round robin.

Admin offload goes to every prefill server: in PD mode the prefix cache and its host
tier live there.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from dsv4_engine.kv_canary import WORKER_LABEL

PROXY_TIMEOUT_S = 600.0
_SAMPLE = re.compile(r"([^#{\s][^{\s]*)(?:\{(.*)\})? (.*)")  # name, labels, value


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
        self.set_workers(prefills, decodes)

    def set_workers(self, prefills: list[PrefillWorker], decodes: list[str]) -> None:
        """Route new requests to these workers; requests in flight keep theirs (as
        sglang-router does when its discovery sees pods come and go)."""
        self.prefills = prefills
        self.decodes = [d.rstrip("/") for d in decodes]
        self._next_prefill = itertools.cycle(prefills)
        self._next_decode = itertools.cycle(self.decodes)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/server_info", self._server_info)
        app.router.add_get("/engine_metrics", self._engine_metrics)
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_post("/admin/hicache/offload", self._offload)
        app.router.add_put("/admin/workers", self._workers)
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

    async def _health(self, _: web.Request) -> web.Response:
        for url in [p.url for p in self.prefills] + self.decodes:
            try:
                async with self.http.get(f"{url}/health") as resp:
                    if resp.status != 200:
                        return web.Response(status=503, text=f"{url}: HTTP {resp.status}")
            except aiohttp.ClientError as err:
                return web.Response(status=503, text=f"{url}: {err}")
        return web.Response(text="ok")

    async def _models(self, _: web.Request) -> web.Response:
        return await self._forward_get(f"{self.decodes[0]}/v1/models")

    async def _server_info(self, _: web.Request) -> web.Response:
        return await self._forward_get(f"{self.decodes[0]}/server_info")

    async def _engine_metrics(self, _: web.Request) -> web.Response:
        """Every worker's /metrics on one page (the route sglang-router serves), each
        sample labelled with its worker (``worker_addr``)."""
        pages = []
        for url in [p.url for p in self.prefills] + self.decodes:
            try:
                async with self.http.get(f"{url}/metrics") as resp:
                    if resp.status != 200:
                        return web.Response(status=502, text=f"{url}/metrics: HTTP {resp.status}")
                    pages.append(_labelled(await resp.text(), url))
            except aiohttp.ClientError as err:
                return web.Response(status=502, text=f"{url}/metrics: {err}")
        return web.Response(text="".join(pages), content_type="text/plain", charset="utf-8")

    async def _forward_get(self, url: str) -> web.Response:
        async with self.http.get(url) as resp:
            return web.Response(status=resp.status, body=await resp.read(),
                                content_type=resp.content_type)  # fmt: skip

    async def _offload(self, _: web.Request) -> web.Response:
        total = 0
        for p in self.prefills:
            async with self.http.post(f"{p.url}/admin/hicache/offload", json={}) as resp:
                if resp.status != 200:
                    return web.Response(status=resp.status, body=await resp.read())
                total += (await resp.json()).get("offloaded_tokens", 0)
        return web.json_response({"offloaded_tokens": total})

    async def _workers(self, request: web.Request) -> web.Response:
        """The worker set, replaced: how a local runtime plays sglang-router's discovery."""
        try:
            body = await request.json()
            prefills = [PrefillWorker(p["url"].rstrip("/"), int(p["bootstrap_port"]))
                        for p in body["prefill"]]  # fmt: skip
            decodes = [str(url) for url in body["decode"]]
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            message = f'body: expected {{"prefill": [{{"url", "bootstrap_port"}}], "decode": [url]}} ({err})'
            return web.json_response({"error": {"message": message}}, status=400)
        if not prefills or not decodes:
            message = "prefill, decode: a PD router needs at least one of each"
            return web.json_response({"error": {"message": message}}, status=400)
        self.set_workers(prefills, decodes)
        return web.json_response({"prefill": len(prefills), "decode": len(decodes)})

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
        target = f"{next(self._next_decode)}{request.path}"
        resp = web.StreamResponse()
        try:
            async with self.http.post(target, json=body) as upstream:
                resp.set_status(upstream.status)
                resp.content_type = upstream.content_type
                await resp.prepare(request)
                async for data in upstream.content.iter_any():
                    await resp.write(data)
                await resp.write_eof()
        except aiohttp.ClientError as err:
            if resp.prepared:
                if isinstance(err, ConnectionResetError):
                    # Writing to the client failed: it left mid-answer (a probe that
                    # stopped early), so there is no one left to answer; not an error.
                    return resp
                raise  # the decode server broke off: cutting the answer short is all that is left
            message = f"decode server {target}: {err or type(err).__name__}"
            return web.json_response({"error": {"message": message}}, status=502)
        return resp


def _labelled(page: str, worker: str) -> str:
    """``page``'s samples with the label ``worker_addr="<worker>"`` added."""
    label = f'{WORKER_LABEL}="{worker}"'
    out = []
    for line in page.splitlines():
        sample = _SAMPLE.match(line)
        if sample is not None:
            name, labels, rest = sample.groups()
            line = f"{name}{{{labels + ',' if labels else ''}{label}}} {rest}"
        out.append(line + "\n")
    return "".join(out)
