"""Classify one completion: the judge shared by `dsv4ctl validate` and the probes.

The order of the checks is the order of causes: markup in the reasoning first, then a
call in another model family's dialect, then degenerate text (a loop that ran into
max_tokens is a loop, not a truncation), then the structure of the DSML block, a cycle of
calls, then the arguments against the tool's schema, and last the echo (a well-formed call
whose values changed — the quietest corruption and the one users notice last).  A chat
message is judged as its completion is: its `reasoning_content` is the reasoning.  The
request context (prompt, tools, echo) travels with the answer because degeneracy is judged
relative to it (see `degenerate`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from dsv4_engine.probe.context import RequestContext
from dsv4_engine.probe.degenerate import call_cycle, degeneracy
from dsv4_engine.probe.dsml import (
    DsmlError,
    DsmlFormat,
    Language,
    ToolCall,
    foreign_markup,
    language,
    markup_in,
    parse,
    split_reasoning,
)
from dsv4_engine.probe.outcome import VALIDATOR_OUTCOMES, Judgement, Outcome
from dsv4_engine.probe.tools import Echo, Validators, check_calls, tool_validators


def classify_completion(
    text: str,
    fmt: DsmlFormat,
    validators: Validators | None = None,
    echo: Echo | None = None,
    context: RequestContext | None = None,
) -> Judgement:
    """Judge a raw completion, as the engine emitted it (DSML not parsed server-side)."""
    return _classify(*split_reasoning(text), fmt, validators, echo, context)


def _classify(
    reasoning: str,
    answer: str,
    fmt: DsmlFormat,
    validators: Validators | None,
    echo: Echo | None,
    context: RequestContext | None,
) -> Judgement:
    if judged := _reasoning_markup(reasoning, fmt):
        return judged
    spoken = language(answer, reasoning)
    if not spoken.prose.strip() and not spoken.values:
        return Judgement(Outcome.DEGENERATE_TEXT, "empty output")
    if judged := _judge_language(spoken, context):
        return judged
    try:
        calls = parse(answer, fmt)
    except DsmlError as err:
        return Judgement(err.outcome, err.detail)
    return _calls(calls, validators, echo)


def _reasoning_markup(reasoning: str, fmt: DsmlFormat) -> Judgement | None:
    why = markup_in(reasoning, fmt)
    return None if why is None else Judgement(Outcome.LEAKED_MARKUP, f"{why} inside the reasoning")


def _judge_language(spoken: Language, context: RequestContext | None) -> Judgement | None:
    """A call in a foreign dialect in the reasoning or the prose (values are data: a file
    may quote any dialect), unless the request holds it; then degenerate text."""
    for where, text in (("inside the reasoning", spoken.reasoning), ("in content", spoken.prose)):
        foreign = foreign_markup(text)
        if foreign is not None and not (context is not None and context.explains(foreign.text)):
            why = f"{foreign.dialect} tool-call markup {foreign.text!r} {where}"
            return Judgement(Outcome.LEAKED_MARKUP, f"{why}: no DSML parser serves it")
    why = degeneracy(spoken, context)
    return None if why is None else Judgement(Outcome.DEGENERATE_TEXT, why)


def _calls(
    calls: Sequence[ToolCall], validators: Validators | None, echo: Echo | None
) -> Judgement:
    """Well-formed calls: a cycle of them first (a stuck decoder), then schema and echo."""
    if why := call_cycle(calls):
        return Judgement(Outcome.DEGENERATE_TEXT, why)
    return check_calls(calls, validators, echo)


def classify_chat_message(
    message: Mapping[str, Any],
    finish_reason: str | None,
    fmt: DsmlFormat,
    validators: Validators | None = None,
    echo: Echo | None = None,
    context: RequestContext | None = None,
) -> Judgement:
    """Judge an OpenAI chat `message`: server-parsed `tool_calls`, or raw DSML in `content`.

    With a tool-call parser on (SGLang `--tool-call-parser deepseekv4`), DSML left in the
    content or the reasoning — exact or a near miss — is markup the parser could not take:
    leaked.  Without one, the content holds the raw block and the strict parser judges it.
    """
    reasoning = message.get("reasoning_content") or ""
    content = message.get("content") or ""
    if not reasoning:  # no reasoning parser: the content holds the reasoning, if any
        reasoning, content = split_reasoning(content)
    raw_calls = message.get("tool_calls") or []
    if not raw_calls:
        judgement = _classify(reasoning, content, fmt, validators, echo, context)
        if (
            finish_reason == "length"
            and judgement.outcome is Outcome.SCHEMA
            and markup_in(content, fmt) is None
        ):
            return Judgement(Outcome.TRUNCATED, "hit max_tokens before any tool call")
        return judgement
    if judged := _reasoning_markup(reasoning, fmt):
        return judged
    if why := markup_in(content, fmt):
        return Judgement(Outcome.LEAKED_MARKUP, f"{why} left in content: {content!r:.80}")
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
    values = tuple(v for call in calls for v in call.args.values() if isinstance(v, str))
    if judged := _judge_language(Language(content, values, reasoning), context):
        return judged
    return _calls(calls, validators, echo)


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


class Judged(NamedTuple):
    """One `dsv4ctl validate` record and its verdict; `label` is the record's expected
    class when it carries one (a labelled corpus)."""

    id: str
    judgement: Judgement
    label: Outcome | None


def classify_records(lines: Sequence[str], fmt: DsmlFormat, source: str) -> list[Judged]:
    """Judge `dsv4ctl validate` input: one JSON object per line (`id`, `text`, `tools`?,
    `echo`?, `prompt`?, `label`?); blank lines are skipped.  Raises ValueError naming the
    first malformed line and its field (a corpus must be whole)."""
    results = []
    for number, line in enumerate(lines, start=1):
        judged = judge_record(line, fmt, f"{source}:{number}")
        if judged is not None:
            results.append(judged)
    return results


def jsonl_lines(text: str) -> list[str]:
    """JSON Lines records: separated by ``\n`` alone, as JSON Lines defines them.  Not
    `str.splitlines`, which also breaks at U+2028/U+2029 and other characters that JSON
    allows unescaped inside a string (a trailing ``\r`` is JSON whitespace)."""
    return text.split("\n")


def judge_jsonl(text: str, fmt: DsmlFormat, source: str) -> tuple[list[Judged], list[str]]:
    """Every well-formed record of a JSONL text judged, and one message per malformed record
    (``source:line: why``): one bad record never hides the verdicts on the rest."""
    results, malformed = [], []
    for number, line in enumerate(jsonl_lines(text), start=1):
        try:
            judged = judge_record(line, fmt, f"{source}:{number}")
        except ValueError as err:
            malformed.append(str(err))
            continue
        if judged is not None:
            results.append(judged)
    return results, malformed


def judge_record(line: str, fmt: DsmlFormat, where: str) -> Judged | None:
    """One input record judged (None: a blank line).  Raises ValueError naming ``where``
    and the field when the record is malformed."""
    if not line.strip():
        return None
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
    prompt = _prompt(record.get("prompt"), where)
    context = (
        RequestContext.of(prompt, tools, echo) if prompt is not None or tools or echo else None
    )
    judgement = classify_completion(record["text"], fmt, validators, echo, context)
    return Judged(str(record["id"]), judgement, _label(record.get("label"), where))


def _prompt(value: Any, where: str) -> str | list[dict[str, Any]] | None:
    """The `prompt` field: the prompt text, or the request's OpenAI chat messages."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(m, dict) for m in value):
        return value
    raise ValueError(f"{where}: field 'prompt' must be a string or a list of chat messages")


def _label(value: Any, where: str) -> Outcome | None:
    if value is None:
        return None
    names = [o.value for o in VALIDATOR_OUTCOMES]
    if value not in names:
        raise ValueError(f"{where}: field 'label' must be one of {', '.join(names)}")
    return Outcome(value)
