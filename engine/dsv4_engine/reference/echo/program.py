"""The echo model's answer: a DSML tool call, written by a small transducer over pointers.

Everything the answer copies — the tool's name, each parameter's name, each value — is
read one token per step at a pointer (`read`, the model's copy head: an indexer lookup by
position and a KV read, see `model`); everything else is literal markup of the V4 format
(`dsml_format`, the one table of the formats).  The pointers are set once, at the trigger
token, by the model's lookups; a pointer that a stale index key sent elsewhere copies
whatever sits there, and stops where that text happens to hold its terminator.

    \\n\\n<｜DSML｜tool_calls>\\n<｜DSML｜invoke name="TOOL">\\n
    <｜DSML｜parameter name="NAME" string="true|false">VALUE</｜DSML｜parameter>\\n   (each)
    </｜DSML｜invoke>\\n</｜DSML｜tool_calls>  EOS

A value whose JSON starts with ``"`` is copied up to the closing quote with
``string="true"``; any other is copied up to ``,`` or ``}`` with ``string="false"``
(JSON escapes are copied as they are: the probes' values have none).  With no tool in the
context there is nothing to call: the model recites the conversation from its start.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum

from dsv4_engine.probe.dsml_format import (
    BLOCK_PREFIX,
    INVOKE,
    PARAMETER,
    SEPARATOR,
)
from dsv4_engine.reference import tokenizer
from dsv4_engine.reference.echo.parser import EOS

MAX_PARAMS = 6
FORMAT = tokenizer.TOOL_CALL_FORMAT


class Phase(IntEnum):
    IDLE = 0
    OPEN = 1
    TOOL = 2
    TOOL_END = 3
    PARAM = 4
    NAME = 5
    TYPE = 6
    TRUE = 7
    FALSE = 8
    VALUE = 9
    PARAM_END = 10
    CLOSE = 11
    DONE = 12
    RECITE = 13


class Term(IntEnum):
    """Where a copy stops (the terminator is not copied)."""

    NONE = 0
    QUOTE = 1
    LITERAL = 2


_TERMINATORS = {Term.NONE: frozenset(), Term.QUOTE: {ord('"')}, Term.LITERAL: {ord(","), ord("}")}}


def _tokens(text: str) -> tuple[int, ...]:
    """Token ids of literal markup, as the model writes it: its pieces one token each."""
    return tuple(tokenizer.encode_output(text))


_S = FORMAT.spelling
LITERALS: dict[Phase, tuple[int, ...]] = {
    Phase.OPEN: _tokens(f'{BLOCK_PREFIX}{_S.block_open}{SEPARATOR}{_S.tag(INVOKE)} name="'),
    Phase.TOOL_END: _tokens(f'">{SEPARATOR}'),
    Phase.PARAM: _tokens(f'{_S.tag(PARAMETER)} name="'),
    Phase.TYPE: _tokens('" string="'),
    Phase.TRUE: _tokens('true">'),
    Phase.FALSE: _tokens('false">'),
    Phase.PARAM_END: _tokens(f"{_S.closing(PARAMETER)}{SEPARATOR}"),
    Phase.CLOSE: _tokens(f"{_S.closing(INVOKE)}{SEPARATOR}{_S.closing(_S.envelope)}"),
}
_COPIES = {Phase.TOOL: Phase.TOOL_END, Phase.NAME: Phase.TYPE, Phase.VALUE: Phase.PARAM_END}


@dataclass(slots=True)
class Controller:
    phase: int = Phase.IDLE
    offset: int = 0
    param: int = 0
    params: int = 0
    term: int = Term.NONE
    ptr: int = 0
    tool: int = 0
    names: list[int] = field(default_factory=lambda: [0] * MAX_PARAMS)
    values: list[int] = field(default_factory=lambda: [0] * MAX_PARAMS)
    held_entry: int = 0  # 1 + the entry the copy head read last (0: none) ...
    held: list[int] = field(default_factory=lambda: [0] * 4)  # ... and its four tokens

    def pack(self) -> list[int]:
        head = [self.phase, self.offset, self.param, self.params, self.term]
        pointers = [self.ptr, self.tool, *self.names, *self.values]
        return head + pointers + [self.held_entry, *self.held]

    @classmethod
    def unpack(cls, values: list[int]) -> Controller:
        n = MAX_PARAMS
        names, values_, rest = values[7 : 7 + n], values[7 + n : 7 + 2 * n], values[7 + 2 * n :]
        return cls(*values[:7], list(names), list(values_), rest[0], list(rest[1:5]))


CONTROLLER_NARROW = 5  # phase, offset, param, params, term: one row slot each
CONTROLLER_WIDE = 2 + 2 * MAX_PARAMS + 5  # pointers and the held entry: two row slots each


def begin(tool: int | None, params: list[tuple[int, int]], start: int) -> Controller:
    """The controller at the trigger, from the pointers its lookups found: the tool's name,
    each parameter's (name, value) start, and the conversation's start (no tool: recite)."""
    if tool is None:
        return Controller(phase=Phase.RECITE, ptr=start)
    ctrl = Controller(phase=Phase.OPEN, tool=tool, params=min(len(params), MAX_PARAMS))
    for i, (name, value) in enumerate(params[:MAX_PARAMS]):
        ctrl.names[i], ctrl.values[i] = name, value
    return ctrl


def choose(ctrl: Controller, read: Callable[[int], int]) -> int:
    """The next token of the answer; advances `ctrl` past it.  `read(pos)` is the token at
    position `pos` of the context, as the model's copy head reads it."""
    while True:
        phase = Phase(ctrl.phase)
        literal = LITERALS.get(phase)
        if literal is not None:
            if ctrl.offset < len(literal):
                ctrl.offset += 1
                return literal[ctrl.offset - 1]
            _after_literal(ctrl, phase, read)
        elif phase in _COPIES or phase is Phase.RECITE:
            token = read(ctrl.ptr)
            if token not in _TERMINATORS[Term(ctrl.term)]:
                ctrl.ptr += 1
                return token
            ctrl.phase, ctrl.offset = _COPIES[phase], 0
        else:  # IDLE or DONE: nothing (more) to say
            ctrl.phase = Phase.DONE
            return EOS


def _after_literal(ctrl: Controller, phase: Phase, read: Callable[[int], int]) -> None:
    ctrl.offset = 0
    if phase is Phase.OPEN:
        ctrl.phase, ctrl.ptr, ctrl.term = Phase.TOOL, ctrl.tool, Term.QUOTE
    elif phase in (Phase.TOOL_END, Phase.PARAM_END):
        if phase is Phase.PARAM_END:
            ctrl.param += 1
        ctrl.phase = Phase.PARAM if ctrl.param < ctrl.params else Phase.CLOSE
    elif phase is Phase.PARAM:
        ctrl.phase, ctrl.ptr, ctrl.term = Phase.NAME, ctrl.names[ctrl.param], Term.QUOTE
    elif phase is Phase.TYPE:
        start = ctrl.values[ctrl.param]
        if read(start) == ord('"'):
            ctrl.phase, ctrl.ptr, ctrl.term = Phase.TRUE, start + 1, Term.QUOTE
        else:
            ctrl.phase, ctrl.ptr, ctrl.term = Phase.FALSE, start, Term.LITERAL
    elif phase in (Phase.TRUE, Phase.FALSE):
        ctrl.phase = Phase.VALUE
    else:  # CLOSE
        ctrl.phase = Phase.DONE
