"""The reference PD router's worker set can be replaced in place (how the local runtime
plays sglang-router's label discovery): new requests go to the new workers."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestClient, TestServer

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
