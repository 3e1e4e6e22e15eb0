"""A strict parser for DeepSeek's DSML tool-call blocks (V3.2, V4, V4.1).

Why our own parser: SGLang's detectors and DeepSeek's `deepseek-recipe` are built to serve
users, so they are lenient — they skip an unclosed invoke, ignore stray text, accept a bare
invoke without its envelope, strip or keep whitespace — and a corrupted answer then reaches
the client looking plausible.  A probe needs the opposite: every deviation from what the
encoders render is reported, with the class of damage, so a corruption rate means something.

The grammar, with every token and separator from the format table in `dsml_format`
(OPEN(x) is ``<｜DSML｜x`` in V3.2/V4 and ``<｜DSML｜ x`` in V4.1, CLOSE(x) its ``</…>``):

    answer  := prose [BLOCK_PREFIX block] [EOS]
    block   := OPEN(env)> SEP invoke (SEP invoke)* SEP CLOSE(env)
    invoke  := OPEN(invoke) name="N"> (SEP param)+ SEP CLOSE(invoke)
             | OPEN(invoke) name="N"> ("\\n" | "\\n\\n") CLOSE(invoke)
             | OPEN(invoke) name="N"/>
    param   := OPEN(parameter) name="P" string="true|false">VALUE CLOSE(parameter)

What a deviation is classed as: a tag of the block spelt otherwise (another format's
envelope or spacing, a near miss such as ASCII ``|`` or no marker, whitespace where the
format has ``\\n``, a JSON body) is ENVELOPE_MISMATCH; tags out of order, stray text or
missing attributes UNBALANCED; text that ends inside the block TRUNCATED; markup outside
the block LEAKED_MARKUP, and so is a call in another model family's dialect (found by
`foreign_markup`, which the parser's caller asks); text after the block — the format ends
the turn there — a runaway (DEGENERATE_TEXT).  `string="true"` values are taken verbatim, `string="false"` values must
be one JSON literal.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple, NoReturn

from dsv4_engine.probe import nearmiss
from dsv4_engine.probe.dsml_format import (
    BLOCK_PREFIX,
    ELEMENT_NAMES,
    EMPTY_INVOKE_BODIES,
    ENVELOPE_NAMES,
    EOS,
    INVOKE,
    MARKER,
    PARAMETER,
    SEPARATOR,
    THINK_END,
    DsmlFormat,
    Spelling,
)
from dsv4_engine.probe.outcome import Outcome

__all__ = [
    "EOS",
    "MARKER",
    "DsmlError",
    "DsmlFormat",
    "ForeignMarkup",
    "Language",
    "ToolCall",
    "foreign_markup",
    "language",
    "markup_in",
    "parse",
    "split_reasoning",
]

TAG = re.compile(
    rf"<(?P<close>/?){MARKER}(?P<space>\s*)(?P<name>[A-Za-z_]+)"
    r'(?P<attrs>(?:\s+[A-Za-z_]+="[^"<>]*")*)(?P<pad>\s*)(?P<selfclose>/?)>'
)
_PARTIAL_TAG = re.compile(rf'</?{MARKER}\s*[A-Za-z_]*(?:\s+[A-Za-z_]+(?:="[^"<>]*"?|=)?)*\s*/?')
_INSIDE_OUTCOMES = (Outcome.ENVELOPE_MISMATCH, Outcome.UNBALANCED)
"""Inside the block: a misspelt tag, and a bare marker fragment."""
_CUT_OUTCOMES = (Outcome.ENVELOPE_MISMATCH, Outcome.TRUNCATED)
"""Where the text ends inside the block: a misspelt tag, and a fragment (a cut tag)."""
_INVOKE_ATTRS = re.compile(r' name="(?P<name>[^"<>]*)"')
_PARAM_ATTRS = re.compile(r' name="(?P<name>[^"<>]*)" string="(?P<string>true|false)"')


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
    OUTSIDE = "before the block"
    ENVELOPE = "inside the envelope"
    INVOKE = "inside an invoke"
    PARAM = "inside a parameter value"
    DONE = "after the block"


@dataclass
class _Parser:
    spelling: Spelling
    state: _State = _State.OUTSIDE
    calls: list[ToolCall] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    """Text since the last tag."""
    invoke_name: str = ""
    invoke_args: dict[str, Any] = field(default_factory=dict)
    param_name: str = ""
    param_is_string: bool = True

    def text(self, chunk: str) -> None:
        if self.state is _State.OUTSIDE:
            _no_near_miss(chunk, self.spelling, "before the block", Outcome.ENVELOPE_MISMATCH)
        elif self.state is _State.DONE:
            _no_near_miss(chunk, self.spelling, "after the block", Outcome.LEAKED_MARKUP)
        self.pending.append(chunk)

    def finish(self) -> tuple[ToolCall, ...]:
        if self.state is not _State.OUTSIDE and self.state is not _State.DONE:
            # A misspelt closing tag left the block open: name it, not the cut it looks like.
            between, in_block = "".join(self.pending), self.state is not _State.PARAM
            _no_near_miss(between, self.spelling, self.state.value, *_CUT_OUTCOMES, in_block)
            raise DsmlError(Outcome.TRUNCATED, f"text ends {self.state.value}")
        if self.state is _State.DONE and (rest := "".join(self.pending)):
            raise DsmlError(
                Outcome.DEGENERATE_TEXT,
                f"runaway: {rest!r:.60} after the tool-call block, where the format ends the turn",
            )
        return tuple(self.calls)

    def tag(self, m: re.Match[str]) -> None:
        name, close, selfclose = m["name"], bool(m["close"]), bool(m["selfclose"])
        if self.state is _State.DONE:
            raise DsmlError(Outcome.LEAKED_MARKUP, f"DSML tag after the block: {m[0]!r}")
        if self.state in (_State.ENVELOPE, _State.INVOKE):
            # A misspelt tag among exact ones: name it before the structure breaks on it.
            between = "".join(self.pending)
            _no_near_miss(between, self.spelling, self.state.value, *_INSIDE_OUTCOMES, True)
        if name not in ELEMENT_NAMES and name.lower() not in ELEMENT_NAMES:
            where = Outcome.LEAKED_MARKUP if self.state is _State.OUTSIDE else Outcome.UNBALANCED
            raise DsmlError(where, f"unknown DSML tag {m[0]!r} {self.state.value}")
        if self.state is _State.PARAM and not (close and name.lower() == PARAMETER):
            # The value ran on past a misspelt closing tag: the spelling is the damage.
            between = "".join(self.pending)
            _no_near_miss(between, self.spelling, self.state.value, *_INSIDE_OUTCOMES, True)
            raise DsmlError(Outcome.UNBALANCED, f"{m[0]!r} inside parameter {self.param_name!r}")
        self._check_spelling(m)
        if name in ENVELOPE_NAMES:
            self._envelope(close, selfclose, m[0])
        elif name == INVOKE:
            self._invoke(close, selfclose, m, m[0])
        else:
            self._param(close, selfclose, m, m[0])
        self.pending = []

    def _check_spelling(self, m: re.Match[str]) -> None:
        name, spelling = m["name"], self.spelling
        expected = spelling.envelope if name.lower() in ENVELOPE_NAMES else name.lower()
        if name == expected and m["space"] == spelling.space:
            return
        if name != name.lower() and name.lower() == expected:
            why = f"element {name!r} where the format spells it {expected!r}"
        elif name.lower() != expected:
            why = f"envelope {name!r} where {spelling.fmt} names it {expected!r}"
        else:
            why = f"{m['space']!r} between the marker and {name!r} where {spelling.fmt} writes {spelling.space!r}"
        raise DsmlError(
            Outcome.ENVELOPE_MISMATCH,
            f"{m[0]!r} is not {spelling.fmt} DSML: {why} "
            f"(expected {spelling.tag(expected, bool(m['close']))!r})",
        )

    def _separator(self, allowed: tuple[str, ...], where: str) -> None:
        """The text since the last tag must be exactly one of `allowed`."""
        chunk = "".join(self.pending)
        if chunk in allowed:
            return
        _no_near_miss(chunk, self.spelling, where, *_INSIDE_OUTCOMES, True)
        if not chunk.strip():
            raise DsmlError(
                Outcome.ENVELOPE_MISMATCH,
                f"layout: {chunk!r} {where} where the format writes {allowed[0]!r}",
            )
        if self.state is _State.INVOKE and _is_json_object(chunk):
            raise DsmlError(
                Outcome.ENVELOPE_MISMATCH,
                f"invoke {self.invoke_name!r} body is a JSON object: the format passes "
                "arguments only as parameter tags (deepseek-recipe reads {} from it)",
            )
        raise DsmlError(Outcome.UNBALANCED, f"stray text {where}: {chunk.strip()!r:.60}")

    def _envelope(self, close: bool, selfclose: bool, raw: str) -> None:
        if selfclose:
            raise DsmlError(Outcome.UNBALANCED, f"self-closing envelope {raw!r}")
        if not close and self.state is _State.OUTSIDE:
            if not "".join(self.pending).endswith(BLOCK_PREFIX):
                raise DsmlError(
                    Outcome.ENVELOPE_MISMATCH,
                    f"layout: the block must follow the prose after {BLOCK_PREFIX!r}, "
                    f"found {''.join(self.pending)[-2:]!r}",
                )
            self.state = _State.ENVELOPE
        elif close and self.state is _State.ENVELOPE:
            if not self.calls:
                raise DsmlError(Outcome.UNBALANCED, "tool-call block without an invoke")
            self._separator((SEPARATOR,), "before the envelope's end")
            self.state = _State.DONE
        else:
            raise DsmlError(Outcome.UNBALANCED, f"{raw!r} {self.state.value}")

    def _invoke(self, close: bool, selfclose: bool, m: re.Match[str], raw: str) -> None:
        if self.state is _State.OUTSIDE and not close:
            raise DsmlError(Outcome.ENVELOPE_MISMATCH, f"{raw!r} without the tool-call envelope")
        if not close and self.state is _State.ENVELOPE:
            self._separator((SEPARATOR,), "inside the envelope")
            attrs = _INVOKE_ATTRS.fullmatch(m["attrs"])
            if attrs is None or m["pad"] or not attrs["name"]:
                raise DsmlError(Outcome.UNBALANCED, f'invoke needs exactly name="…": {raw!r}')
            if selfclose:
                self.calls.append(ToolCall(attrs["name"], {}))
                return
            self.state, self.invoke_name, self.invoke_args = _State.INVOKE, attrs["name"], {}
        elif close and self.state is _State.INVOKE:
            allowed = (SEPARATOR,) if self.invoke_args else EMPTY_INVOKE_BODIES
            self._separator(allowed, f"inside invoke {self.invoke_name!r}")
            self.calls.append(ToolCall(self.invoke_name, self.invoke_args))
            self.state = _State.ENVELOPE
        else:
            raise DsmlError(Outcome.UNBALANCED, f"{raw!r} {self.state.value}")

    def _param(self, close: bool, selfclose: bool, m: re.Match[str], raw: str) -> None:
        if self.state is _State.OUTSIDE:
            raise DsmlError(Outcome.ENVELOPE_MISMATCH, f"{raw!r} without the tool-call envelope")
        if not close and self.state is _State.INVOKE and not selfclose:
            self._separator((SEPARATOR,), f"inside invoke {self.invoke_name!r}")
            attrs = _PARAM_ATTRS.fullmatch(m["attrs"])
            if attrs is None or m["pad"] or not attrs["name"]:
                raise DsmlError(
                    Outcome.UNBALANCED,
                    f'parameter needs exactly name="…" string="true|false": {raw!r}',
                )
            if attrs["name"] in self.invoke_args:
                raise DsmlError(Outcome.SCHEMA, f"parameter {attrs['name']!r} given twice")
            self.state, self.param_name = _State.PARAM, attrs["name"]
            self.param_is_string = attrs["string"] == "true"
        elif close and self.state is _State.PARAM and not selfclose:
            self.invoke_args[self.param_name] = self._param_value()
            self.state = _State.INVOKE
        else:
            raise DsmlError(Outcome.UNBALANCED, f"{raw!r} {self.state.value}")

    def _param_value(self) -> Any:
        raw = "".join(self.pending)
        if self.param_is_string:
            return raw
        try:
            return json.loads(raw, parse_constant=_reject_constant)
        except ValueError:
            raise DsmlError(
                Outcome.SCHEMA,
                f'parameter {self.param_name!r} string="false" is not JSON: {raw!r:.60}',
            ) from None


def _no_near_miss(
    text: str,
    spelling: Spelling,
    where: str,
    tag_outcome: Outcome,
    fragment_outcome: Outcome = Outcome.LEAKED_MARKUP,
    in_block: bool = False,
) -> None:
    """Raise when `text` holds something shaped like DSML that is not the exact spelling
    (`in_block`: `text` lies between the block's tags, see `nearmiss.find`)."""
    near = nearmiss.find(text, spelling, in_block)
    if near is None:
        return
    what = "DSML-like tag" if near.is_tag else "DSML marker fragment"
    raise DsmlError(
        tag_outcome if near.is_tag else fragment_outcome,
        f"{what} {near.text!r:.60} {where} is not {spelling.fmt} DSML: {near.deviation}",
    )


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _reject_constant(value: str) -> Any:
    raise ValueError(f"JSON constant {value} is not allowed")


def split_reasoning(text: str) -> tuple[str, str]:
    """(reasoning, answer): the answer starts after the first ``</think>``, if any.  A
    ``<think>`` that opens the text opens the reasoning (the model wrote it where the prompt
    does not end with it) and is no part of it; anywhere else it is a stray token."""
    head, sep, tail = text.partition(THINK_END)
    return (head.removeprefix(_THINK_START), tail) if sep else ("", text)


_THINK_START = "<think>"


def parse(text: str, fmt: DsmlFormat) -> tuple[ToolCall, ...]:
    """The calls of an answer (reasoning already split off); `DsmlError` on any deviation."""
    body = text.removesuffix(EOS)
    parser = _Parser(fmt.spelling)
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
    if _ends_with_partial_marker(tail):
        raise DsmlError(Outcome.TRUNCATED, f"text ends inside a DSML tag: {tail[-12:]!r}")
    parser.text(tail)
    return parser.finish()


def markup_in(text: str, fmt: DsmlFormat) -> str | None:
    """Why `text` (reasoning, or content next to server-parsed calls) holds DSML markup —
    the exact marker or a near miss — or None when it holds none."""
    if MARKER in text:
        at = text.index(MARKER)
        return f"DSML markup {text[max(0, at - 2) : at + 20]!r}"
    near = nearmiss.find(text, fmt.spelling)
    return None if near is None else f"DSML-like markup {near.text!r:.60} ({near.deviation})"


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
    """Whether the text was cut inside a tag: a ``<``, ``</`` or part of the marker at the
    end — a lone ``<`` only where the block begins (after the blank line), since prose may
    end in one."""
    lt = tail.rfind("<")
    if lt == -1 or ">" in tail[lt:]:
        return False
    fragment = tail[lt:]
    if fragment == "<":
        return tail.endswith(BLOCK_PREFIX + "<")
    return len(fragment) >= 2 and (
        ("<" + MARKER).startswith(fragment) or ("</" + MARKER).startswith(fragment)
    )


@dataclass(frozen=True)
class Language:
    """An answer split for the degeneracy judge: the words the model wrote as language
    (prose, stray text, an unfinished value), the values of complete parameters, and the
    reasoning before the answer."""

    prose: str
    values: tuple[str, ...]
    reasoning: str = ""


def language(text: str, reasoning: str = "") -> Language:
    """Split an answer (reasoning split off, and passed apart) without parsing it: it may
    be broken or in another format's spelling, so any parameter-shaped element (exact,
    other format, or a near miss) delimits a value.  Each DSML tag becomes one NUL
    character, so tags that legitimately repeat make no loop."""
    body = text.removesuffix(EOS)
    values = tuple(m[1] for m in _VALUE.finditer(body))
    return Language(TAG.sub("\x00", _VALUE.sub("\x00", body)), values, reasoning)


_FOREIGN_DIALECTS = {
    "Hermes/Qwen": re.compile(r"<tool_call>\s*[{<]"),
    "Llama/Qwen3-Coder": re.compile(r"<function=[\w.-]+>\s*[{<]"),
    "DeepSeek-V3": re.compile(r"<[|｜]tool[▁_]calls?[▁_]begin[|｜]>"),
    "Mistral": re.compile(r"\[TOOL_CALLS\]\s*\["),
    "Llama 3.1": re.compile(r"<\|python_tag\|>"),
}
"""One pattern per dialect, each led by a literal the regex engine skips to (one
alternation of them all scans ten times slower)."""


class ForeignMarkup(NamedTuple):
    """Another model family's tool-call markup (see `foreign_markup`)."""

    text: str
    dialect: str


def foreign_markup(text: str) -> ForeignMarkup | None:
    """A tool call written in another model family's dialect, or None.

    Why a class of its own, LEAKED_MARKUP: the model wrote a call, but in a spelling no
    DeepSeek parser reads (its training data holds these dialects), so the client gets the
    markup as content and no call — markup outside the block, what LEAKED_MARKUP means.
    Dialects spelt with DSML's own element names (``<function_calls>``, ``<invoke
    name=…>``) are not looked for here: the text cannot tell them from DSML that lost its
    marker, a near miss the parser names (ENVELOPE_MISMATCH).  Each pattern is the
    dialect's opening with the start of its body, so prose that names a tag is no call."""
    for dialect, pattern in _FOREIGN_DIALECTS.items():
        if m := pattern.search(text):
            return ForeignMarkup(m[0], dialect)
    return None


_VALUE = re.compile(
    rf"<\s*[^\s<>]{{0,8}}\s*{PARAMETER}\b[^<>]*>(.*?)<\s*/\s*[^\s<>]{{0,8}}\s*{PARAMETER}\s*>",
    re.DOTALL | re.IGNORECASE,
)
