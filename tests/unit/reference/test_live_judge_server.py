"""The reference engine judges every tool-call answer it serves, streamed and not, and
shows the counts on its /metrics: the echo model's call VALID, a call cut by max_tokens
TRUNCATED, an answer without tools not at all; a PD prefill server judges nothing."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
from aiohttp.test_utils import TestClient, TestServer

from dsv4_engine import live_judge
from dsv4_engine.engine_config import ReferenceModelKind
from dsv4_engine.probe.workload import ECHO_TOOL, echo_instruction, random_echo
from dsv4_engine.reference.engine import Engine
from dsv4_engine.reference.server import EXAMPLES_PATH, ReferenceServer
from dsv4_engine.reference.settings import DisaggregationMode, ServeSettings

ECHO = ServeSettings(reference_model=ReferenceModelKind.ECHO)


def sample(metrics: str, outcome: str, role: str = "unified", revision: str = "r7") -> int:
    line = f'{live_judge.METRIC}{{revision="{revision}",role="{role}",outcome="{outcome}"}} '
    (value,) = [ln.removeprefix(line) for ln in metrics.splitlines() if ln.startswith(line)]
    return int(value)


def echo_body(seed: int, **extra) -> dict:
    echo = random_echo(random.Random(seed))
    messages = [{"role": "user", "content": echo_instruction(echo)}]
    return {"messages": messages, "tools": [ECHO_TOOL], "max_tokens": 600, **extra}


def run(settings: ServeSettings, scenario) -> None:
    async def main() -> None:
        engine = Engine(settings)
        engine.start()
        server = ReferenceServer(settings, engine)
        try:
            async with TestClient(TestServer(server.app())) as client:
                await scenario(client, server)
        finally:
            engine.stop()

    asyncio.run(main())


async def metrics_after(client: TestClient, server: ReferenceServer) -> str:
    assert server.judge is not None and server.judge.drain()
    return await (await client.get("/metrics")).text()


def test_served_tool_call_answers_are_counted_per_outcome_streamed_and_not(monkeypatch):
    monkeypatch.setenv(live_judge.REVISION_ENV, "r7")

    async def scenario(client: TestClient, server: ReferenceServer) -> None:
        before = await metrics_after(client, server)
        assert all(sample(before, o) == 0 for o in live_judge.OUTCOMES), "all shown at 0"
        resp = await client.post("/v1/chat/completions", json=echo_body(1))
        assert (await resp.json())["choices"][0]["finish_reason"] == "tool_calls"
        resp = await client.post("/v1/chat/completions", json=echo_body(2, stream=True))
        events = [ln for ln in (await resp.text()).splitlines() if ln.startswith("data: ")]
        assert '"finish_reason": "tool_calls"' in events[-2]
        for body in (echo_body(3, max_tokens=30), echo_body(4, max_tokens=30, stream=True)):
            await (await client.post("/v1/chat/completions", json=body)).read()
        no_tools = echo_body(5)
        del no_tools["tools"]
        await (await client.post("/v1/chat/completions", json=no_tools)).read()
        page = await metrics_after(client, server)
        assert sample(page, "VALID") == 2
        assert sample(page, "TRUNCATED") == 2
        assert sum(sample(page, o) for o in live_judge.OUTCOMES) == 4, "no tools: not judged"
        count = f'{live_judge.TOKENS_METRIC}_count{{revision="r7",role="unified"}} 4'
        assert count in page
        assert f"# TYPE {live_judge.TOKENS_METRIC} histogram" in page
        # No examples unless asked for: the route does not exist.
        assert (await client.get(EXAMPLES_PATH)).status == 404

    run(ECHO, scenario)


def test_judging_off_counts_nothing_and_shows_no_family(monkeypatch):
    monkeypatch.setenv(live_judge.SWITCH_ENV, "off")

    async def scenario(client: TestClient, server: ReferenceServer) -> None:
        assert server.judge is None
        resp = await client.post("/v1/chat/completions", json=echo_body(1))
        assert (await resp.json())["choices"][0]["finish_reason"] == "tool_calls"
        assert live_judge.METRIC not in await (await client.get("/metrics")).text()

    run(ECHO, scenario)


def test_a_pd_prefill_server_judges_nothing():
    """Its answers carry no generated text; the user gets the decode server's."""
    settings = ServeSettings(disaggregation_mode=DisaggregationMode.PREFILL)

    async def scenario(client: TestClient, server: ReferenceServer) -> None:
        assert server.judge is None
        assert live_judge.METRIC not in await (await client.get("/metrics")).text()

    run(settings, scenario)


@pytest.mark.parametrize("stream", [False, True])
def test_opted_in_examples_are_served_redacted(monkeypatch, stream):
    monkeypatch.setenv(live_judge.EXAMPLES_ENV, "2")
    monkeypatch.setenv(live_judge.REVISION_ENV, "r7")

    def corrupt(answer: live_judge.Answer, fmt) -> tuple[str, str]:
        return "ARG_CORRUPTION", "record_id: 'R-ABC123' changed"

    async def scenario(client: TestClient, server: ReferenceServer) -> None:
        assert server.judge is not None
        server.judge._judge = corrupt
        for seed in range(3):
            body = echo_body(seed, stream=stream)
            await (await client.post("/v1/chat/completions", json=body)).read()
        page = await metrics_after(client, server)
        assert sample(page, "ARG_CORRUPTION") == 3
        examples = await (await client.get(EXAMPLES_PATH)).json()
        assert len(examples) == 2 and examples[0]["outcome"] == "ARG_CORRUPTION"
        assert examples[0]["detail"] == "xxxxxx_xx: 'x-xxx000' xxxxxxx"
        assert "R-" not in json.dumps(examples)

    run(ECHO, scenario)
