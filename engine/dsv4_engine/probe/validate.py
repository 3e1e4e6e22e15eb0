"""Classify one completion: the judge shared by `dsv4ctl validate` and the probes.

The order of the checks is the order of causes: degenerate text first (a loop that ran
into max_tokens is a loop, not a truncation), then the structure of the DSML block, then
the arguments against the tool's schema, and last the echo (a well-formed call whose values
changed — the quietest corruption and the one users notice last).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from dsv4_engine.probe.degenerate import degeneracy
from dsv4_engine.probe.dsml import MARKER, DsmlError, DsmlFormat, ToolCall, parse, split_reasoning
from dsv4_engine.probe.outcome import Judgement, Outcome
from dsv4_engine.probe.tools import Echo, Validators, check_calls, tool_validators


def classify_completion(
    text: str,
    fmt: DsmlFormat,
    validators: Validators | None = None,
    echo: Echo | None = None,
) -> Judgement:
    """Judge a raw completion, as the engine emitted it (DSML not parsed server-side)."""
    reasoning, answer = split_reasoning(text)
    if MARKER in reasoning:
        return Judgement(Outcome.LEAKED_MARKUP, "DSML markup inside the reasoning")
    if why := degeneracy(answer):
        return Judgement(Outcome.DEGENERATE_TEXT, why)
    try:
        calls = parse(answer, fmt)
    except DsmlError as err:
        return Judgement(err.outcome, err.detail)
    return check_calls(calls, validators, echo)


def classify_chat_message(
    message: Mapping[str, Any],
    finish_reason: str | None,
    fmt: DsmlFormat,
    validators: Validators | None = None,
    echo: Echo | None = None,
) -> Judgement:
    """Judge an OpenAI chat `message`: server-parsed `tool_calls`, or raw DSML in `content`.

    With a tool-call parser on (SGLang `--tool-call-parser deepseekv4`), DSML left in the
    content is markup the parser could not take: leaked.  Without one, the content holds
    the raw block and the strict parser judges it.
    """
    content = message.get("content") or ""
    raw_calls = message.get("tool_calls") or []
    if not raw_calls:
        judgement = classify_completion(content, fmt, validators, echo)
        if (
            finish_reason == "length"
            and judgement.outcome is Outcome.SCHEMA
            and MARKER not in content
        ):
            return Judgement(Outcome.TRUNCATED, "hit max_tokens before any tool call")
        return judgement
    if MARKER in content:
        return Judgement(Outcome.LEAKED_MARKUP, f"DSML left in content: {content!r:.80}")
    if content.strip() and (why := degeneracy(content)):
        return Judgement(Outcome.DEGENERATE_TEXT, why)
    calls = []
    for i, raw in enumerate(raw_calls):
        function = raw.get("function") or {}
        try:
            args = json.loads(function.get("arguments") or "{}")
        except ValueError:
            return Judgement(Outcome.SCHEMA, f"tool_calls[{i}].arguments is not JSON")
        if not isinstance(args, dict):
            return Judgement(Outcome.SCHEMA, f"tool_calls[{i}].arguments is not an object")
        calls.append(ToolCall(str(function.get("name", "")), args))
    return check_calls(calls, validators, echo)


def parse_echo(value: Any, where: str) -> Echo | None:
    """`{"tool": name, "args": {...}}` from a validate input line; None when absent."""
    if value is None:
        return None
    if (
        not isinstance(value, Mapping)
        or not isinstance(value.get("tool"), str)
        or not isinstance(value.get("args"), Mapping)
    ):
        raise ValueError(f'{where}: echo must be {{"tool": <string>, "args": <object>}}')
    return Echo(value["tool"], dict(value["args"]))


def classify_records(
    lines: Sequence[str], fmt: DsmlFormat, source: str
) -> list[tuple[str, Judgement]]:
    """Judge `dsv4ctl validate` input: one JSON object per line (`id`, `text`, `tools`?,
    `echo`?); blank lines are skipped.  Raises ValueError naming the line and field."""
    results = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            record = json.loads(line)
        except ValueError as err:
            raise ValueError(f"{where}: not a JSON object ({err.msg})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
        if not isinstance(record.get("id"), str | int):
            raise ValueError(f"{where}: field 'id' (string) is missing")
        if not isinstance(record.get("text"), str):
            raise ValueError(f"{where}: field 'text' (the raw completion, a string) is missing")
        tools = record.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise ValueError(f"{where}: field 'tools' must be a list of OpenAI tool objects")
        try:
            validators = tool_validators(tools) if tools is not None else None
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
        echo = parse_echo(record.get("echo"), where)
        results.append(
            (str(record["id"]), classify_completion(record["text"], fmt, validators, echo))
        )
    return results
