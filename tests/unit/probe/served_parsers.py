"""What a client receives for a completion: SGLang 0.5.23's served tool-call parser, and
DeepSeek's deepseek-recipe parser (the one SGLang's `dsv4`/`dsv41` chat encodings use).

SGLang: `--tool-call-parser deepseekv32 | deepseekv4 | deepseekv41` selects the detector
through `FunctionCallParser.ToolCallParserEnum`; the chat server calls
`parser.has_tool_call(text)` and then `parser.parse_non_stream(text)` on the answer (the
reasoning parser has already split off the reasoning; end-of-sentence is not in the text).
Both are run here exactly so, on the real classes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import deepseek_recipe as dr

from dsv4_engine.probe.dsml import EOS, DsmlFormat, split_reasoning

SGLANG_PARSERS = {
    DsmlFormat.V32: "deepseekv32",
    DsmlFormat.V4: "deepseekv4",
    DsmlFormat.V41: "deepseekv41",
}
RECIPE_MODELS = {
    DsmlFormat.V32: "DeepSeek-V4-Pro",
    DsmlFormat.V4: "DeepSeek-V4-Pro",
    DsmlFormat.V41: "DeepSeek-V4.1-Flash",
}
"""deepseek-recipe parses V4 and V4.1 only; its V4 parser reads any envelope name, so it
stands in for V3.2 too (the exemption oracle needs a second opinion for every format)."""


@dataclass(frozen=True)
class Served:
    """The message a client gets: its text content and its tool calls (name, arguments)."""

    content: str
    calls: tuple[tuple[str, Any], ...]

    def describe(self) -> str:
        if not self.calls:
            return "text only"
        names = ", ".join(name for name, _ in self.calls)
        return f"{len(self.calls)} call{'s' if len(self.calls) > 1 else ''} ({names})"


def sglang_serve(text: str, fmt: DsmlFormat, tools: Sequence[dict[str, Any]]) -> Served:
    """SGLang's served message for a raw completion (reasoning split off, EOS dropped)."""
    from sglang.srt.entrypoints.openai.protocol import Tool
    from sglang.srt.function_call.function_call_parser import FunctionCallParser

    _quiet_sglang()
    answer = served_text(split_reasoning(text)[1])
    parser = FunctionCallParser([Tool(**t) for t in tools], SGLANG_PARSERS[fmt])
    if not parser.has_tool_call(answer):
        return Served(answer, ())
    content, calls = parser.parse_non_stream(answer)
    return Served(content, tuple((c.name, _loads(c.parameters)) for c in calls))


def served_text(text: str) -> str:
    """What of a completion reaches the server's parsers and the client: all but
    end-of-sentence, a special token the detokenizer skips."""
    return text.removesuffix(EOS)


def recipe_serve(text: str, fmt: DsmlFormat, tools: Sequence[dict[str, Any]]) -> Served:
    """deepseek-recipe's chat-completion message for a raw completion."""
    model = RECIPE_MODELS[fmt]
    body = {"model": model, "messages": [{"role": "user", "content": "go"}], "tools": list(tools)}
    options = dr.ConversionOptions(default_thinking_mode="</think>" in text)
    request = dr.ChatCompletionRequest(body).convert(options)
    processor = dr.StreamProcessor(
        dr.ChatCompletionRequest.chunk_generator(request, "id", model), request.parsing_options
    )
    response = dr.ChatCompletionResponse("id", model, 0, 0, 0)
    for chunk in (
        processor.push(dr.InferenceChunk.ready())
        + processor.push(dr.InferenceChunk.text(text))
        + processor.push(dr.InferenceChunk.finish(dr.InferenceFinishReason.Stop))
        + processor.finish()
    ):
        response.accumulate(chunk)
    message = json.loads(response.to_json())["choices"][0]["message"]
    calls = tuple(
        (c["function"]["name"], _loads(c["function"]["arguments"]))
        for c in message.get("tool_calls") or []
    )
    return Served(message.get("content") or "", calls)


def _loads(arguments: str) -> Any:
    """Arguments as the client decodes them; text that is not JSON stays text."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


@cache
def _quiet_sglang() -> None:
    """SGLang logs a warning for every call it drops; the cross-check drops many on purpose."""
    logging.getLogger("sglang").setLevel(logging.ERROR)
