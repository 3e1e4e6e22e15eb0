"""The development fallback for sglang-router (`dsv4_engine.reference.router`): each request
goes to both a prefill and a decode server with a bootstrap room, as sglang-router sends it;
its /engine_metrics is every worker's page in sglang-router's spelling.  A client leaving
mid-answer, or a decode server out of reach, is an ordinary outcome, not a traceback."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web
from aiohttp.client_exceptions import ClientConnectionResetError
from aiohttp.test_utils import TestClient, TestServer

from dsv4_engine import kv_canary
from dsv4_engine.reference.router import PrefillWorker, Router


def decode_server(
    completions: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> TestServer:
    """A stand-in decode server that answers /v1/completions with ``completions``."""
    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    return TestServer(app)


def prefill_server(bodies: list[dict] | None = None) -> TestServer:
    """A stand-in prefill server: records each body and answers it, as a prefill does once
    it has handed its pages over."""

    async def prefill(request: web.Request) -> web.Response:
        if bodies is not None:
            bodies.append(await request.json())
        return web.json_response({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})

    app = web.Application()
    app.router.add_post("/v1/completions", prefill)
    return TestServer(app)


def url_of(server: TestServer) -> str:
    return str(server.make_url("")).rstrip("/")


def router_to(prefill: TestServer, decode: TestServer) -> Router:
    return Router([PrefillWorker(url_of(prefill), 8998)], [url_of(decode)])


@pytest.mark.asyncio
async def test_each_request_reaches_both_servers_with_one_bootstrap_room():
    sent: list[dict] = []
    received: list[dict] = []

    async def decode(request: web.Request) -> web.Response:
        received.append(await request.json())
        return web.json_response({"choices": [{"index": 0, "text": "ok"}]})

    async with prefill_server(sent) as prefill, decode_server(decode) as dec:
        router = router_to(prefill, dec)
        async with TestClient(TestServer(router.app())) as client:
            for _ in range(2):
                resp = await client.post("/v1/completions", json={"prompt": "x"})
                assert resp.status == 200 and (await resp.json())["choices"][0]["text"] == "ok"
    assert sent == received and len({b["bootstrap_room"] for b in sent}) == 2
    assert {(b["bootstrap_host"], b["bootstrap_port"]) for b in sent} == {("127.0.0.1", 8998)}


@pytest.mark.asyncio
async def test_engine_metrics_serves_every_workers_page_labelled_with_its_worker():
    """As sglang-router's GET /engine_metrics (`:` spelled `_`): the probe reads each
    engine's kv-canary count through the router it probes."""

    def worker(violations: int) -> web.Application:
        page = (
            f"# TYPE {kv_canary.METRIC} counter\n"
            f'{kv_canary.METRIC}{{launch_tag="INDEX_K_READ",fail_reason="load_not_landed"}} {violations}\n'
            "sglang:num_running_reqs 0\n"
        )

        async def metrics(_: web.Request) -> web.Response:
            return web.Response(text=page)

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        return app

    async with TestServer(worker(0)) as prefill, TestServer(worker(3)) as decode:
        p, d = (str(s.make_url("")).rstrip("/") for s in (prefill, decode))
        router = Router([PrefillWorker(p, 2)], [d])
        async with TestClient(TestServer(router.app())) as client:
            page = await (await client.get("/engine_metrics")).text()
    assert kv_canary.read(page) == {
        (p, "INDEX_K_READ", "load_not_landed"): 0,
        (d, "INDEX_K_READ", "load_not_landed"): 3,
    }
    assert f'sglang_num_running_reqs{{worker_addr="{d}"}} 0' in page


@pytest.mark.asyncio
async def test_a_client_leaving_mid_answer_ends_its_request_quietly(caplog):
    """A probe that gives up on a streamed answer closes its connection: the router drops the
    decode server's request too and logs no error, and the next request is served."""
    release, dropped = asyncio.Event(), asyncio.Event()
    calls = 0

    async def stream(request: web.Request) -> web.StreamResponse:
        nonlocal calls
        calls += 1
        resp = web.StreamResponse()
        resp.content_type = "text/event-stream"
        await resp.prepare(request)
        await resp.write(b"data: first\n\n")
        if calls == 1:  # the answer the client leaves: tokens go on once it has left
            await release.wait()
            try:
                while True:  # as an engine streams, until the router drops the request
                    await resp.write(b"data: more\n\n")
                    await asyncio.sleep(0.01)
            except (ConnectionResetError, asyncio.CancelledError):  # the router left
                dropped.set()
                raise
        await resp.write(b"data: second\n\n")
        await resp.write_eof()
        return resp

    async with prefill_server() as prefill, decode_server(stream) as decode:
        router = router_to(prefill, decode)
        # As `dsv4-engine router` serves it (web.run_app): a client leaving does not cancel
        # the handler, whose next write then meets the closed connection.
        served = TestServer(router.app(), handler_cancellation=False)
        async with served as server, aiohttp.ClientSession() as http:
            url = str(server.make_url("/v1/completions"))
            with caplog.at_level(logging.DEBUG):
                resp = await http.post(url, json={"prompt": "x"})
                assert await resp.content.readline() == b"data: first\n"
                resp.close()  # the client leaves mid-answer
                release.set()
                await asyncio.wait_for(dropped.wait(), 30)
                async with http.post(url, json={"prompt": "y"}) as again:
                    assert again.status == 200
                    assert await again.read() == b"data: first\n\ndata: second\n\n"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


@pytest.mark.asyncio
async def test_a_client_gone_as_its_answer_ends_is_no_error(caplog, monkeypatch):
    """The client leaves as its answer ends (a probe that stops early, as `make bench-echo`'s
    FAIL runs do): the router's last write, the end of the chunked body, meets the closing
    connection.  That timing is rare here, so the write's failure is injected, as aiohttp
    raises it ("Cannot write to closing transport")."""

    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.content_type = "text/event-stream"
        await resp.prepare(request)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async with prefill_server() as prefill, decode_server(stream) as decode:
        router = router_to(prefill, decode)
        router_app = router.app()
        closing: list[web.StreamResponse] = []
        real_write_eof = web.StreamResponse.write_eof

        async def write_eof(self: web.StreamResponse, data: bytes = b"") -> None:
            request = self._req
            if request is not None and request.app is router_app and request.headers.get("x-gone"):
                closing.append(self)
                raise ClientConnectionResetError("Cannot write to closing transport")
            await real_write_eof(self, data)

        monkeypatch.setattr(web.StreamResponse, "write_eof", write_eof)
        served = TestServer(router_app, handler_cancellation=False)
        async with served as server, aiohttp.ClientSession() as http:
            url = str(server.make_url("/v1/completions"))
            with caplog.at_level(logging.DEBUG):
                gone = await http.post(url, json={"prompt": "x"}, headers={"x-gone": "1"})
                assert gone.status == 200
                assert await gone.content.readline() == b"data: [DONE]\n"
                gone.close()
                async with http.post(url, json={"prompt": "y"}) as again:
                    assert await again.read() == b"data: [DONE]\n\n"
    assert closing, "the injected failure was never reached"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


@pytest.mark.asyncio
async def test_an_unreachable_decode_server_is_a_502_naming_it():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    router = Router([PrefillWorker("http://127.0.0.1:1", 2)], [dead])
    async with TestClient(TestServer(router.app())) as client:
        resp = await client.post("/v1/chat/completions", json={"messages": []})
        assert resp.status == 502
        assert dead in (await resp.json())["error"]["message"]
