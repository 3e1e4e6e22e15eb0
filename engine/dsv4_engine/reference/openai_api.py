"""OpenAI request bodies in, response bodies out: plain functions, no I/O.

`tool_calls` are parsed from the DSML block a V4 model writes, with the project's strict
DSML parser; an answer that does not parse stays raw text in `content` (as SGLang leaves
text its tool-call parser rejects), so a probe still sees and judges it.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from dsv4_engine.probe.dsml import MARKER, DsmlError, DsmlFormat, parse
from dsv4_engine.reference import chat, tokenizer

DEFAULT_MAX_TOKENS = 64
BLOCK_START = f"<{MARKER}"  # a V4 tool-call block opens `<｜DSML｜tool_calls>`
OPENING = f"\n\n{BLOCK_START}"  # ... after a blank line, which is not content


class BadRequest(ValueError):
    """A request the engine refuses with HTTP 400; the message names the field."""


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    max_tokens: int
    stream: bool


def max_tokens(body: dict[str, Any]) -> int:
    value = body.get("max_completion_tokens", body.get("max_tokens", DEFAULT_MAX_TOKENS))
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise BadRequest(f"max_tokens: expected a positive integer, got {value!r}")
    return value


def _check_sampling(body: dict[str, Any]) -> None:
    """Greedy only: sampling would make the warm-vs-cold comparison meaningless."""
    temperature = body.get("temperature", 0)
    if not isinstance(temperature, int | float) or temperature < 0:
        raise BadRequest(f"temperature: expected a number >= 0, got {temperature!r}")


def chat_prompt(body: dict[str, Any]) -> Prompt:
    _check_sampling(body)
    try:
        ids = chat.prompt_ids(body)
    except chat.ChatRequestError as err:
        raise BadRequest(str(err)) from None
    return Prompt(ids, max_tokens(body), bool(body.get("stream", False)))


def completion_prompt(body: dict[str, Any]) -> Prompt:
    _check_sampling(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        ids = tokenizer.encode(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        if not all(0 <= t < tokenizer.VOCAB_SIZE for t in prompt):
            raise BadRequest(f"prompt: token ids must be in 0..{tokenizer.VOCAB_SIZE - 1}")
        ids = list(prompt)
    else:
        raise BadRequest("prompt: expected a non-empty string or list of token ids")
    return Prompt(ids, max_tokens(body), bool(body.get("stream", False)))


def chat_message(text: str, tools_requested: bool) -> dict[str, Any]:
    """The assistant message for generated text, with `tool_calls` when they parse."""
    parsed = _tool_calls(text) if tools_requested else None
    if parsed is None:
        return {"role": "assistant", "content": text}
    content, calls = parsed
    return {"role": "assistant", "content": content, "tool_calls": calls}


def _tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]] | None:
    """(the content before the DSML block, the OpenAI tool calls) of ``text``; None when it
    holds no block that parses (then the whole text is content, as SGLang leaves it)."""
    if MARKER not in text:
        return None
    try:
        calls = parse(text, DsmlFormat.V4)
    except DsmlError:
        return None
    if not calls:
        return None
    content = text[: text.index(MARKER) - 1].strip() or None
    return content, [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.args)},
        }
        for c in calls
    ]


class ToolCallStream:
    """A chat answer streamed as SGLang streams it with a tool-call parser on
    (`DeepSeekV32Detector`, which V4's extends): text before the DSML block as `content`
    deltas (without the blank line that opens the block), the block held back until it is
    whole, then each call as `tool_calls` deltas — the first with its id, type and name,
    the next with its arguments — which an OpenAI client joins into the message
    `chat_message` answers unstreamed.  A block that does not parse is streamed as content
    after all, as SGLang gives back text its parser rejects."""

    def __init__(self) -> None:
        self._text = ""  # the whole answer so far
        self._sent = 0  # how much of it went out as content
        self._in_block = False
        self.called = False  # some tool_calls delta was streamed: finish_reason tool_calls

    def feed(self, piece: str) -> list[dict[str, Any]]:
        """The content ``piece`` releases: up to the block (or to a tail that could begin
        it), nothing once inside it."""
        self._text += piece
        if self._in_block:
            return []
        pending = self._text[self._sent :]
        if BLOCK_START in pending:
            self._in_block = True
            upto = self._sent + len(pending[: pending.index(BLOCK_START)].removesuffix("\n\n"))
        else:
            upto = len(self._text) - _held_tail(pending)
        released, self._sent = self._text[self._sent : upto], upto
        return [{"content": released}] if released else []

    def end(self) -> list[dict[str, Any]]:
        """The deltas the end releases: the parsed calls, or what is left as content."""
        parsed = _tool_calls(self._text)
        if parsed is None:
            rest = self._text[self._sent :]
            return [{"content": rest}] if rest else []
        _, calls = parsed
        self.called = True
        deltas: list[dict[str, Any]] = []
        for index, call in enumerate(calls):
            function = call["function"]
            head = {**call, "index": index, "function": {"name": function["name"], "arguments": ""}}
            args = {"index": index, "function": {"arguments": function["arguments"]}}
            deltas += [{"tool_calls": [head]}, {"tool_calls": [args]}]
        return deltas


def _held_tail(text: str) -> int:
    """How many characters at the end of ``text`` could begin a DSML block (with or without
    the blank line before it): held back until the next piece says."""
    for size in range(min(len(text), len(OPENING) - 1), 0, -1):
        tail = text[-size:]
        if OPENING.startswith(tail) or BLOCK_START.startswith(tail):
            return size
    return 0


def usage(prompt_tokens: int, completion_tokens: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def sglext(body: dict[str, Any], cached: int, host: int) -> dict[str, Any] | None:
    """SGLang's extension of a response, where the request asked for it: with
    ``return_cached_tokens_details``, the prompt tokens found in the device cache and those
    loaded back from the host tier, as SGLang 0.5.23 answers them
    (``{"cached_tokens_details": {"device": D, "host": H}}``, none when nothing was cached:
    `SchedulerOutputStreamer.get_cached_tokens_details`, `SglExt`)."""
    if not body.get("return_cached_tokens_details") or not cached:
        return None
    return {"cached_tokens_details": {"device": cached - host, "host": host}}


def envelope(kind: str, model: str, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "id": f"{'chatcmpl' if kind == 'chat.completion' else 'cmpl'}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        **extra,
    }


def error_body(
    message: str, kind: str = "invalid_request_error", code: int = 400
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": code}}
