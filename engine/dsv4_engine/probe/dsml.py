"""A strict parser for DeepSeek's DSML tool-call blocks (V3.2, V4, V4.1).

Why our own parser: SGLang's detectors and DeepSeek's `deepseek-recipe` are built to serve
users, so they are lenient — they skip an unclosed invoke, ignore stray text, accept a bare
invoke without its envelope — and a corrupted answer then reaches the client looking
plausible.  A probe needs the opposite: every deviation from the format the encoder renders
is reported, with the class of damage, so a corruption rate means something.

The grammar accepted (｜ is U+FF5C; V4.1 puts one space after the marker in every tag and
names the envelope ` calls`):

    completion := [reasoning "</think>"] prose [block] [prose] [EOS]
    block      := <｜DSML｜ENV> ws (invoke ws)+ </｜DSML｜ENV>
    invoke     := <｜DSML｜invoke name="N"> ws (param ws)* </｜DSML｜invoke>
                | <｜DSML｜invoke name="N"> ws JSON-object ws </｜DSML｜invoke>
                | <｜DSML｜invoke name="N"/>
    param      := <｜DSML｜parameter name="P" string="true|false">VALUE</｜DSML｜parameter>

`string="true"` values are taken verbatim (no stripping: the encoder writes none);
`string="false"` values must be one JSON literal.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any, NoReturn

from dsv4_engine.probe.outcome import Outcome

MARKER = "｜DSML｜"
EOS = "<｜end▁of▁sentence｜>"
THINK_END = "</think>"
ENVELOPE_NAMES = frozenset({"function_calls", "tool_calls", "calls"})

TAG = re.compile(
    r"<(?P<close>/?)｜DSML｜(?P<space> ?)(?P<name>[A-Za-z_]+)"
    r'(?P<attrs>(?:\s+[A-Za-z_]+="[^"<>]*")*)\s*(?P<selfclose>/?)>'
)
_PARTIAL_TAG = re.compile(r'</?｜DSML｜ ?[A-Za-z_]*(?:\s+[A-Za-z_]+(?:="[^"<>]*"?|=)?)*\s*/?')
_ATTR = re.compile(r'([A-Za-z_]+)="([^"<>]*)"')


class DsmlFormat(StrEnum):
    V32 = "v32"
    V4 = "v4"
    V41 = "v41"

    @property
    def envelope(self) -> str:
        return {"v32": "function_calls", "v4": "tool_calls", "v41": "calls"}[self.value]

    @property
    def spaced(self) -> bool:
        return self is DsmlFormat.V41

    def tag(self, name: str, close: bool = False) -> str:
        """The spelling of a tag's opening, e.g. ``<｜DSML｜ invoke`` for V4.1."""
        return f"<{'/' if close else ''}{MARKER}{' ' if self.spaced else ''}{name}"


class DsmlError(Exception):
    """A completion that breaks the grammar; `outcome` is the class of damage."""

    def __init__(self, outcome: Outcome, detail: str) -> None:
        super().__init__(detail)
        self.outcome = outcome
        self.detail = detail


@dataclass(frozen=True)
class ToolCall:
    name: str
    args: dict[str, Any]


class _State(Enum):
    OUTSIDE = "outside the block"
    ENVELOPE = "inside the envelope"
    INVOKE = "inside an invoke"
    PARAM = "inside a parameter value"
    DONE = "after the block"


@dataclass
class _Parser:
    fmt: DsmlFormat
    state: _State = _State.OUTSIDE
    calls: list[ToolCall] = field(default_factory=list)
    invoke_name: str = ""
    invoke_args: dict[str, Any] = field(default_factory=dict)
    invoke_body: list[str] = field(default_factory=list)
    param_name: str = ""
    param_is_string: bool = True
    param_value: list[str] = field(default_factory=list)

    def text(self, chunk: str) -> None:
        """Text between tags; prose outside the block is left to `degenerate`."""
        if self.state is _State.ENVELOPE and chunk.strip():
            raise DsmlError(Outcome.UNBALANCED, f"stray text inside the envelope: {chunk!r:.60}")
        if self.state is _State.INVOKE:
            self.invoke_body.append(chunk)
        elif self.state is _State.PARAM:
            self.param_value.append(chunk)

    def tag(self, m: re.Match[str]) -> None:
        name, close = m["name"], bool(m["close"])
        spaced, selfclose = bool(m["space"]), bool(m["selfclose"])
        known = name in ENVELOPE_NAMES or name in ("invoke", "parameter")
        if self.state is _State.DONE:
            raise DsmlError(Outcome.LEAKED_MARKUP, f"DSML tag after the block: {m[0]!r}")
        if not known:
            where = Outcome.LEAKED_MARKUP if self.state is _State.OUTSIDE else Outcome.UNBALANCED
            raise DsmlError(where, f"unknown DSML tag {m[0]!r} {self.state.value}")
        if self.state is _State.PARAM and not (close and name == "parameter"):
            raise DsmlError(Outcome.UNBALANCED, f"{m[0]!r} inside parameter {self.param_name!r}")
        wrong_envelope = name in ENVELOPE_NAMES and name != self.fmt.envelope
        if wrong_envelope or spaced != self.fmt.spaced:
            raise DsmlError(
                Outcome.ENVELOPE_MISMATCH,
                f"{m[0]!r} is not {self.fmt.value} DSML (expected "
                f"{self.fmt.tag(self.fmt.envelope if name in ENVELOPE_NAMES else name, close)!r})",
            )
        attrs = dict(_ATTR.findall(m["attrs"]))
        if name in ENVELOPE_NAMES:
            self._envelope(close, selfclose, m[0])
        elif name == "invoke":
            self._invoke(close, selfclose, attrs, m[0])
        else:
            self._param(close, selfclose, attrs, m[0])

    def _envelope(self, close: bool, selfclose: bool, raw: str) -> None:
        if selfclose:
            raise DsmlError(Outcome.UNBALANCED, f"self-closing envelope {raw!r}")
        if not close and self.state is _State.OUTSIDE:
            self.state = _State.ENVELOPE
        elif close and self.state is _State.ENVELOPE:
            if not self.calls:
                raise DsmlError(Outcome.UNBALANCED, "tool-call block without an invoke")
            self.state = _State.DONE
        else:
            raise DsmlError(Outcome.UNBALANCED, f"{raw!r} {self.state.value}")

    def _invoke(self, close: bool, selfclose: bool, attrs: dict[str, str], raw: str) -> None:
        if self.state is _State.OUTSIDE and not close:
            raise DsmlError(Outcome.ENVELOPE_MISMATCH, f"{raw!r} without the tool-call envelope")
        if not close and self.state is _State.ENVELOPE:
            if not attrs.get("name"):
                raise DsmlError(Outcome.UNBALANCED, f"invoke without a name: {raw!r}")
            if selfclose:
                self.calls.append(ToolCall(attrs["name"], {}))
                return
            self.state, self.invoke_name = _State.INVOKE, attrs["name"]
            self.invoke_args, self.invoke_body = {}, []
        elif close and self.state is _State.INVOKE:
            self.calls.append(ToolCall(self.invoke_name, self._invoke_arguments()))
            self.state = _State.ENVELOPE
        else:
            raise DsmlError(Outcome.UNBALANCED, f"{raw!r} {self.state.value}")

    def _invoke_arguments(self) -> dict[str, Any]:
        body = "".join(self.invoke_body).strip()
        if not body:
            return self.invoke_args
        if self.invoke_args:
            raise DsmlError(Outcome.UNBALANCED, f"stray text between parameters: {body!r:.60}")
        try:
            parsed = json.loads(body, parse_constant=_reject_constant)
        except ValueError:
            raise DsmlError(
                Outcome.UNBALANCED, f"invoke {self.invoke_name!r} body is neither tags nor JSON"
            ) from None
        if not isinstance(parsed, dict):
            raise DsmlError(Outcome.SCHEMA, f"invoke {self.invoke_name!r} JSON body not an object")
        return parsed

    def _param(self, close: bool, selfclose: bool, attrs: dict[str, str], raw: str) -> None:
        if self.state is _State.OUTSIDE:
            raise DsmlError(Outcome.ENVELOPE_MISMATCH, f"{raw!r} without the tool-call envelope")
        if not close and self.state is _State.INVOKE and not selfclose:
            if "".join(self.invoke_body).strip():
                raise DsmlError(Outcome.UNBALANCED, "stray text before a parameter")
            self.invoke_body = []
            kind = attrs.get("string")
            if not attrs.get("name") or kind not in ("true", "false"):
                raise DsmlError(
                    Outcome.UNBALANCED, f'parameter needs name="…" and string="true|false": {raw!r}'
                )
            if attrs["name"] in self.invoke_args:
                raise DsmlError(Outcome.SCHEMA, f"parameter {attrs['name']!r} given twice")
            self.state, self.param_name = _State.PARAM, attrs["name"]
            self.param_is_string, self.param_value = kind == "true", []
        elif close and self.state is _State.PARAM:
            self.invoke_args[self.param_name] = self._param_value()
            self.state = _State.INVOKE
        else:
            raise DsmlError(Outcome.UNBALANCED, f"{raw!r} {self.state.value}")

    def _param_value(self) -> Any:
        raw = "".join(self.param_value)
        if self.param_is_string:
            return raw
        try:
            return json.loads(raw, parse_constant=_reject_constant)
        except ValueError:
            raise DsmlError(
                Outcome.SCHEMA,
                f'parameter {self.param_name!r} string="false" is not JSON: {raw!r:.60}',
            ) from None


def _reject_constant(value: str) -> Any:
    raise ValueError(f"JSON constant {value} is not allowed")


def split_reasoning(text: str) -> tuple[str, str]:
    """(reasoning, answer): the answer starts after the first ``</think>``, if any."""
    head, sep, tail = text.partition(THINK_END)
    return (head, tail) if sep else ("", text)


def parse(text: str, fmt: DsmlFormat) -> tuple[ToolCall, ...]:
    """The calls of an answer (reasoning already split off); `DsmlError` on any deviation.
    Prose around the block is allowed and not returned: `degenerate` judges it."""
    body = text.removesuffix(EOS)
    parser = _Parser(fmt)
    pos = 0
    while (hit := body.find(MARKER, pos)) != -1:
        start = hit - 2 if body[max(0, hit - 2) : hit] == "</" else hit - 1
        opens = start >= 0 and body[start] == "<"
        m = TAG.match(body, start) if opens else None
        if m is None:
            _bad_marker(body, start if opens else hit, parser.state)
        parser.text(body[pos : m.start()])
        parser.tag(m)
        pos = m.end()
    tail = body[pos:]
    if parser.state is not _State.OUTSIDE and parser.state is not _State.DONE:
        raise DsmlError(Outcome.TRUNCATED, f"text ends {parser.state.value}")
    if _ends_with_partial_marker(tail):
        raise DsmlError(Outcome.TRUNCATED, f"text ends inside a DSML tag: {tail[-12:]!r}")
    parser.text(tail)
    return tuple(parser.calls)


def _bad_marker(body: str, start: int, state: _State) -> NoReturn:
    """A DSML marker that does not open a well-formed tag: cut off, or damage."""
    rest = body[start:]
    if _PARTIAL_TAG.fullmatch(rest):
        raise DsmlError(Outcome.TRUNCATED, f"text ends inside a DSML tag: {rest[:40]!r}")
    outcome = (
        Outcome.LEAKED_MARKUP if state in (_State.OUTSIDE, _State.DONE) else Outcome.UNBALANCED
    )
    raise DsmlError(outcome, f"malformed DSML markup {state.value}: {rest[:40]!r}")


def _ends_with_partial_marker(tail: str) -> bool:
    lt = tail.rfind("<")
    if lt == -1 or ">" in tail[lt:]:
        return False
    fragment = tail[lt:]
    return len(fragment) >= 2 and (
        ("<" + MARKER).startswith(fragment) or ("</" + MARKER).startswith(fragment)
    )
