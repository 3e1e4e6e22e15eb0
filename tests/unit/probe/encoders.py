"""Valid completions as the formats' own encoders render them — the validator's producers.

V4 and V4.1: DeepSeek's `deepseek-recipe` (the package SGLang 0.5.23 renders V4 prompts
with).  V3.2: DeepSeek's V3.2 encoder as SGLang ships it (`encoding_dsv32.py`).  A
completion is the assistant turn of a rendered conversation, from after the generation
header (``<｜Assistant｜>`` plus the ``<think>``/``</think>`` the prompt ends with) through
end-of-sentence: exactly what the engine emits.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import deepseek_recipe as dr

from dsv4_engine.probe.dsml import EOS, DsmlFormat

ASSISTANT = "<｜Assistant｜>"
# One small tool the hand-written validator cases call (near misses, held-out fixes).
WEATHER_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            },
        },
    }
]
Call = tuple[str, dict[str, Any]]


def render(
    fmt: DsmlFormat,
    tools: Sequence[dict[str, Any]],
    calls: Sequence[Call],
    prose: str = "",
    reasoning: str | None = None,
) -> str:
    """The completion the format's encoder renders for this assistant turn."""
    prompt = (_v32 if fmt is DsmlFormat.V32 else _recipe)(fmt, tools, calls, prose, reasoning)
    turn = prompt[prompt.rindex(ASSISTANT, 0, prompt.rindex(EOS)) + len(ASSISTANT) :]
    completion = turn[: turn.index(EOS) + len(EOS)]
    # The prompt ends with <think> (thinking) or </think> (not): the engine emits the rest.
    return completion.removeprefix("<think>" if reasoning is not None else "</think>")


def _recipe(
    fmt: DsmlFormat, tools: Sequence[dict], calls: Sequence[Call], prose: str, reasoning: str | None
) -> str:
    encoding = dr.DeepseekV41Encoding() if fmt is DsmlFormat.V41 else dr.DeepseekV4Encoding()
    definitions = [
        dr.ToolDefinition(t["function"]["name"], "", t["function"]["parameters"]) for t in tools
    ]
    tool_calls = [
        dr.ToolCall(f"c{i}", name, json.dumps(args, ensure_ascii=False))
        for i, (name, args) in enumerate(calls)
    ]
    message = dr.AssistantMessage(prose, reasoning_content=reasoning, tool_calls=tool_calls or None)
    conversation = dr.Conversation(
        [dr.UserMessage("go"), message], tools=definitions, thinking_mode=reasoning is not None
    )
    return encoding.render_conversation(conversation).prompt


def _v32(
    fmt: DsmlFormat, tools: Sequence[dict], calls: Sequence[Call], prose: str, reasoning: str | None
) -> str:
    from sglang.srt.entrypoints.openai import encoding_dsv32

    assistant: dict[str, Any] = {"role": "assistant", "content": prose}
    if reasoning is not None:
        assistant["reasoning_content"] = reasoning
    if calls:
        assistant["tool_calls"] = [
            {"type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
            for n, a in calls
        ]
    system: dict[str, Any] = {"role": "system", "content": ""}
    if tools:
        system["tools"] = list(tools)
    messages = [system, {"role": "user", "content": "go"}, assistant]
    mode = "thinking" if reasoning is not None else "chat"
    return encoding_dsv32.encode_messages(messages, thinking_mode=mode)
