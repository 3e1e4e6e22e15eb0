"""Tool schemas and the checks of a parsed call against them and against the echo request.

Why jsonschema rather than a hand-written subset: tool schemas in the wild use the whole
vocabulary (`enum`, `pattern`, `anyOf`, nested objects), and a checker that silently
ignores a keyword would call a violating call valid.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema

from dsv4_engine.probe.dsml import ToolCall
from dsv4_engine.probe.outcome import VALID, Judgement, Outcome


@dataclass(frozen=True)
class Echo:
    """The call a prompt asked for: exactly one call of `tool` with exactly `args`."""

    tool: str
    args: dict[str, Any]
    schema_valid: bool = False
    """True when `args` are known to satisfy the tool's schema (the probe generates them
    so): an answer equal to them then needs no schema check, which is most of the cost of
    judging a valid answer."""


Validators = Mapping[str, jsonschema.protocols.Validator]


def tool_validators(
    tools: Sequence[Mapping[str, Any]],
) -> dict[str, jsonschema.protocols.Validator]:
    """name -> validator of its parameters, from OpenAI tool objects (or bare functions).
    Compiling a schema (checking it against the metaschema) costs milliseconds, far more
    than checking a call, and a log repeats the same tool set on every line: compiled
    once per distinct tool set."""
    try:
        key = json.dumps(list(tools), sort_keys=True)
    except (TypeError, ValueError):
        return _compile(tools)
    return dict(_compiled(key))


@functools.lru_cache(maxsize=256)
def _compiled(tools_json: str) -> tuple[tuple[str, jsonschema.protocols.Validator], ...]:
    return tuple(_compile(json.loads(tools_json)).items())


def _compile(tools: Sequence[Mapping[str, Any]]) -> dict[str, jsonschema.protocols.Validator]:
    validators: dict[str, jsonschema.protocols.Validator] = {}
    for i, tool in enumerate(tools):
        function = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ValueError(f"tools[{i}]: expected an object with function.name (a string)")
        parameters = function.get("parameters", {"type": "object"})
        try:
            jsonschema.Draft202012Validator.check_schema(parameters)
        except jsonschema.SchemaError as err:
            raise ValueError(
                f"tools[{i}] ({function['name']}): parameters is not a JSON schema: {err.message}"
            ) from None
        validators[function["name"]] = jsonschema.Draft202012Validator(parameters)
    return validators


def check_calls(
    calls: Sequence[ToolCall], validators: Validators | None, echo: Echo | None
) -> Judgement:
    """Schema first (a wrong shape), then the echo (right shape, wrong values)."""
    if echo is not None and not calls:
        return Judgement(Outcome.SCHEMA, f"no tool call; expected a call of {echo.tool!r}")
    if echo is not None and echo.schema_valid and _is_exactly(calls, echo):
        return VALID
    if validators is not None:
        for call in calls:
            if call.name not in validators:
                return Judgement(Outcome.SCHEMA, f"call of unknown tool {call.name!r}")
            error = jsonschema.exceptions.best_match(validators[call.name].iter_errors(call.args))
            if error is not None:
                where = "/".join(map(str, error.absolute_path)) or "arguments"
                return Judgement(Outcome.SCHEMA, f"{call.name}: {where}: {error.message:.120}")
    if echo is None or _is_exactly(calls, echo):
        return VALID
    if len(calls) != 1 or calls[0].name != echo.tool:
        names = ", ".join(c.name for c in calls)
        return Judgement(Outcome.ARG_CORRUPTION, f"expected one call of {echo.tool!r}, got {names}")
    got, want = _canonical(calls[0].args), _canonical(echo.args)
    return Judgement(Outcome.ARG_CORRUPTION, f"echoed {got:.120} != requested {want:.120}")


def _is_exactly(calls: Sequence[ToolCall], echo: Echo) -> bool:
    return (
        len(calls) == 1
        and calls[0].name == echo.tool
        and _canonical(calls[0].args) == _canonical(echo.args)
    )


def _canonical(value: Any) -> str:
    """JSON with sorted keys: tells 1 from 1.0 from true, which == in Python does not."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False)
