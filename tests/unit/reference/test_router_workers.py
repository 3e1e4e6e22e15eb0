"""The reference PD router's worker set can be replaced in place (how the local runtime
plays sglang-router's label discovery): new requests go to the new workers.  Its
/engine_metrics gathers every worker's page."""

from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from dsv4_engine import kv_canary
from dsv4_engine.reference.router import PrefillWorker, Router


@pytest.mark.asyncio
async def test_workers_are_replaced_in_place_and_bad_sets_are_refused():
    router = Router([PrefillWorker("http://127.0.0.1:1", 2)], ["http://127.0.0.1:3"])
    async with TestClient(TestServer(router.app())) as client:
        body = {
            "prefill": [{"url": "http://127.0.0.1:5/", "bootstrap_port": 6}],
            "decode": ["http://127.0.0.1:7"],
        }
        resp = await client.put("/admin/workers", json=body)
        assert resp.status == 200 and await resp.json() == {"prefill": 1, "decode": 1}
        assert router.prefills == [PrefillWorker("http://127.0.0.1:5", 6)]
        assert router.decodes == ["http://127.0.0.1:7"]
        empty = await client.put("/admin/workers", json={"prefill": [], "decode": []})
        assert empty.status == 400
        assert "at least one of each" in (await empty.json())["error"]["message"]
        garbled = await client.put("/admin/workers", json={"prefill": "x"})
        assert garbled.status == 400
        assert router.decodes == ["http://127.0.0.1:7"]  # refused sets change nothing


@pytest.mark.asyncio
async def test_engine_metrics_serves_every_workers_page_labelled_with_its_worker():
    """As sglang-router's GET /engine_metrics: the probe reads each engine's kv-canary count
    through the router it probes."""

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
    assert f'sglang:num_running_reqs{{worker_addr="{d}"}} 0' in page
