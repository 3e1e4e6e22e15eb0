"""The echo model's reading of its context, one token at a time: which tokens to tag.

A finite-state reader over the chat template's token stream (the part of the echo model a
trained model's lower layers would learn).  It follows the regions the special tokens open
(system, user, assistant), scans JSON in system and user text with a bounded depth
counter, and tags the tokens later lookups must find (`codes.Tag`):

* START — the first token after BOS;
* TOOL_NAME — the first character of the first tool's ``"name"`` in the tool schemas;
* SCHEMA_PROP(i) — the ``:`` after that tool's i-th parameter name, carrying the name's
  hash and start;
* INSTR_VALUE(hash) — the first character of each value of a user turn's JSON object,
  by the hash of its key, carrying where the value starts.

It also recognises the trigger: ``</think>`` right after ``<｜Assistant｜>``, where the
answer begins.  Its state is a handful of small integers that travel between steps in the
token's row of the sliding-window layer (see `model`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from operator import attrgetter

from dsv4_engine.reference import tokenizer
from dsv4_engine.reference.echo.codes import TAG_VALUES, TURNS, Tag

BOS = tokenizer.BOS_ID
USER = tokenizer.special_id("<｜User｜>")
ASSISTANT = tokenizer.special_id("<｜Assistant｜>")
THINK_END = tokenizer.special_id("</think>")
EOS = tokenizer.EOS_ID
MAX_DEPTH = 15
_WHITESPACE = frozenset(b" \t\r\n")


def name_hash(data: bytes) -> int:
    """The 12-bit hash a key or parameter name is looked up by."""
    h = 0
    for b in data:
        h = (h * 31 + b) % TAG_VALUES
    return h


_NAME = name_hash(b"name")
_PROPERTIES = name_hash(b"properties")


class Region:
    NONE, SYSTEM, USER, ASSISTANT = range(4)


class Pending:
    """What the first character after a key's ``:`` starts."""

    NONE, TOOL, PROPS, VALUE = range(4)


@dataclass(slots=True)
class ParseState:
    region: int = Region.NONE
    turn: int = 0
    after_assistant: int = 0
    depth: int = 0
    in_string: int = 0
    escaped: int = 0
    string_start: int = 0  # of the string open, or else the last one closed (a key if
    string_hash: int = 0  # a ':' follows)
    pending: int = Pending.NONE
    pending_hash: int = 0
    props_depth: int = 0  # depth of the first tool's parameter names, 0: not inside
    props: int = 0  # parameters tagged so far
    tools_seen: int = 0  # 1 once the first tool's name is tagged, 2 once its props closed

    def copy(self) -> ParseState:
        return ParseState(*_VALUES(self))

    def pack(self) -> list[int]:
        return list(_VALUES(self))

    @classmethod
    def unpack(cls, values: list[int]) -> ParseState:
        return cls(*values)


_VALUES = attrgetter(*(f.name for f in fields(ParseState)))
# Positions and hashes: two row slots each (bf16 holds integers exactly only up to 256).
WIDE_FIELDS = frozenset({"string_start", "string_hash", "pending_hash"})


def step(state: ParseState, token: int, pos: int) -> tuple[tuple[int, ...] | None, bool]:
    """Consume one token (mutating `state`): (its tag or None, whether it is the trigger).

    A tag is (kind, value, turn, extra 1, extra 2).
    """
    if token >= tokenizer.BYTE_TOKENS:
        return _special(state, token, pos)
    state.after_assistant = 0
    if state.region not in (Region.SYSTEM, Region.USER):
        return None, False
    if state.in_string:
        _in_string(state, token)
        return None, False
    tag = None
    if state.pending and token not in _WHITESPACE:
        tag = _value_start(state, token, pos)
    if token == ord('"'):
        state.in_string, state.string_start, state.string_hash = 1, pos + 1, 0
    elif token in (ord("{"), ord("[")):
        state.depth = min(MAX_DEPTH, state.depth + 1)
    elif token in (ord("}"), ord("]")):
        state.depth = max(0, state.depth - 1)
        if state.props_depth and state.depth < state.props_depth:
            state.props_depth, state.tools_seen = 0, 2
    elif token == ord(":"):
        tag = _key(state, pos) or tag
    return tag, False


def _special(state: ParseState, token: int, pos: int) -> tuple[tuple[int, ...] | None, bool]:
    trigger = token == THINK_END and bool(state.after_assistant)
    state.after_assistant = int(token == ASSISTANT)
    tag = None
    if token == BOS:
        for f in fields(ParseState):
            setattr(state, f.name, f.default)
        state.region = Region.SYSTEM
        tag = (Tag.START, 0, 0, pos + 1, 0)
    elif token in (USER, ASSISTANT, EOS):
        region = {USER: Region.USER, ASSISTANT: Region.ASSISTANT, EOS: Region.NONE}[token]
        turn = (state.turn + 1) % TURNS if token == USER else state.turn
        state.region, state.turn = region, turn
        state.depth = state.in_string = state.escaped = 0
        state.pending = Pending.NONE
    return tag, trigger


def _in_string(state: ParseState, token: int) -> None:
    if state.escaped:
        state.escaped = 0
    elif token == ord("\\"):
        state.escaped = 1
    elif token == ord('"'):
        state.in_string = 0
        return
    state.string_hash = (state.string_hash * 31 + token) % TAG_VALUES


def _key(state: ParseState, pos: int) -> tuple[int, ...] | None:
    """A ':' outside strings: the string before it is a key at the current depth."""
    if state.region == Region.USER:
        if state.depth == 1:
            state.pending, state.pending_hash = Pending.VALUE, state.string_hash
        return None
    if state.tools_seen == 0 and state.depth == 1 and state.string_hash == _NAME:
        state.pending = Pending.TOOL
    elif state.tools_seen == 1 and state.depth == 2 and state.string_hash == _PROPERTIES:
        state.pending = Pending.PROPS
    elif state.props_depth and state.depth == state.props_depth:
        ordinal, state.props = state.props, state.props + 1
        return (Tag.SCHEMA_PROP, ordinal, 0, state.string_hash, state.string_start)
    return None


def _value_start(state: ParseState, token: int, pos: int) -> tuple[int, ...] | None:
    pending, state.pending = state.pending, Pending.NONE
    if pending == Pending.TOOL and token == ord('"'):
        state.tools_seen = 1
        return (Tag.TOOL_NAME, 0, 0, pos + 1, 0)
    if pending == Pending.PROPS and token == ord("{"):
        state.props_depth = state.depth + 1  # the '{' is counted right after this
    if pending == Pending.VALUE:
        return (Tag.INSTR_VALUE, state.pending_hash, state.turn, pos, 0)
    return None
