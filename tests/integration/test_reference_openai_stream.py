"""The official `openai` client against the reference engine: a streamed tool-call request
receives the call as `tool_calls` deltas, which the client joins into the same call the
unstreamed request answers, as SGLang 0.5.23 streams them with its tool-call parser on
(`OpenAIServingChat._process_tool_call_stream`: text as `content`, then each call's id and
name, then its arguments)."""

from __future__ import annotations

import json
import random

import openai
import pytest

from dsv4_engine.probe.workload import ECHO_TOOL, echo_instruction, random_echo

pytestmark = pytest.mark.slow

FLAGS = ("--reference-model", "echo")


@pytest.fixture(scope="module")
def client(start_server_module) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{start_server_module(*FLAGS)}/v1", api_key="none")


def request(seed: int) -> tuple[dict, dict]:
    echo = random_echo(random.Random(seed))
    messages = [{"role": "user", "content": echo_instruction(echo)}]
    body = {"model": "dsv4-reference", "messages": messages, "tools": [ECHO_TOOL]}
    return body, echo.args


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_streamed_tool_call_arrives_as_tool_calls_deltas_joining_to_the_call(client, seed):
    body, args = request(seed)
    whole = client.chat.completions.create(**body, max_tokens=600)
    (call,) = whole.choices[0].message.tool_calls
    assert whole.choices[0].finish_reason == "tool_calls"
    assert json.loads(call.function.arguments) == args

    chunks = list(client.chat.completions.create(**body, max_tokens=600, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    with_calls = [d for d in deltas if d.tool_calls]
    assert len(with_calls) >= 2, "the name first, then the arguments"
    head = with_calls[0].tool_calls[0]
    assert head.id and head.type == "function" and head.function.name == call.function.name
    joined = "".join(d.tool_calls[0].function.arguments or "" for d in with_calls)
    assert json.loads(joined) == args
    assert not any("DSML" in (d.content or "") for d in deltas), "no markup leaks as content"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_streamed_answer_without_tools_is_all_content(client):
    body, _ = request(4)
    del body["tools"]
    whole = client.chat.completions.create(**body, max_tokens=40)
    chunks = client.chat.completions.create(**body, max_tokens=40, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
