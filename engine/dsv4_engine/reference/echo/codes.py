"""The echo model's constructed codes: what its index keys, queries and KV rows hold.

Index keys (one 128-dim key per compressed entry, stored by the pool as fp8, bf16 or fp4)
are concatenations of one-hot codes, so a query that asks for one code scores the entry
holding it strictly highest, and 0/1 values survive every index-K dtype exactly:

* dims 0-47, the entry's position: its index as three hex digits, one-hot each.  A
  position query scores 3 on the entry it names and at most 2 on any other.
* dims 48-55, the tag kind (one-hot, weighted `KIND_WEIGHT` in queries), 56-103 the tag's
  12-bit value (three hex digits), 104-119 the user turn it belongs to.  A tag query
  scores `exact_tag_score` on an entry with that tag and less on any other.

KV rows hold small integers, which bf16 stores exactly up to 256: a 16-bit number takes
two slots (high byte, low byte).  A compressed entry is the mean of its four raw rows, so
each raw row puts its token in the slot pair of its place in the block and the entry,
times four, gives all four tokens back exactly.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from enum import IntEnum

import torch

INDEX_DIM = 128
HEX = 16
POSITION_DIGITS = 3
TAG_DIGITS = 3
TURNS = 16
MAX_ENTRIES = HEX**POSITION_DIGITS  # 4096 entries of 4 tokens: a 16384-token context
TAG_VALUES = HEX**TAG_DIGITS
KIND_WEIGHT = 8.0
_KIND_AT = POSITION_DIGITS * HEX
_VALUE_AT = _KIND_AT + 8
_TURN_AT = _VALUE_AT + TAG_DIGITS * HEX
assert _TURN_AT + TURNS <= INDEX_DIM
assert TAG_DIGITS == POSITION_DIGITS  # one digit-place table for both codes

EXACT_POSITION_SCORE = float(POSITION_DIGITS)


class Tag(IntEnum):
    """What a token marks for later lookups (see `parser`)."""

    NONE = 0
    START = 1  # the beginning of the conversation (first token after BOS)
    TOOL_NAME = 2  # the first tool's name in the tool schemas
    SCHEMA_PROP = 3  # a parameter of that tool, by ordinal; extras: name hash, name start
    INSTR_VALUE = 4  # a value of the user's JSON arguments, by key hash; extra: its start


def exact_tag_score(with_turn: bool) -> float:
    return KIND_WEIGHT + TAG_DIGITS + (1.0 if with_turn else 0.0)


def _digits(value: int, count: int) -> list[int]:
    return [(value >> (4 * d)) & (HEX - 1) for d in range(count)]


_PLACES = torch.arange(POSITION_DIGITS)


def entry_keys(entries: torch.Tensor, tags: torch.Tensor) -> torch.Tensor:
    """Index keys [n, 128] of the entries numbered `entries` [n] whose tag fields (kind,
    value, turn) are the rows of `tags` [n, 3] (int64; kind 0: untagged)."""
    n = len(tags)
    keys = torch.zeros((n, INDEX_DIM))
    rows = torch.arange(n)
    digits = (entries[:, None] >> (4 * _PLACES)) & (HEX - 1)
    keys[rows[:, None], _PLACES * HEX + digits] = 1.0
    tagged = tags[:, 0] > 0
    if bool(tagged.any()):
        t, r = tags[tagged], rows[tagged]
        keys[r, _KIND_AT + t[:, 0]] = 1.0
        value_digits = (t[:, 1:2] >> (4 * _PLACES)) & (HEX - 1)
        keys[r[:, None], _VALUE_AT + _PLACES * HEX + value_digits] = 1.0
        keys[r, _TURN_AT + t[:, 2] % TURNS] = 1.0
    return keys


@functools.lru_cache(maxsize=MAX_ENTRIES)
def position_query(entry: int) -> torch.Tensor:
    q = torch.zeros(INDEX_DIM)
    for d, digit in enumerate(_digits(entry, POSITION_DIGITS)):
        q[d * HEX + digit] = 1.0
    return q


@functools.lru_cache(maxsize=TAG_VALUES * 4)
def tag_query(kind: Tag, value: int, turn: int | None = None) -> torch.Tensor:
    q = torch.zeros(INDEX_DIM)
    q[_KIND_AT + kind] = KIND_WEIGHT
    for d, digit in enumerate(_digits(value, TAG_DIGITS)):
        q[_VALUE_AT + d * HEX + digit] = 1.0
    if turn is not None:
        q[_TURN_AT + turn % TURNS] = 1.0
    return q


# -- KV rows -------------------------------------------------------------------------------

TOKEN_SLOTS = 8  # dims 0-7 of a c4 row: the four tokens of a block, two slots each
TAG_SLOTS = 8  # dims 8-15: kind, value (2), turn, extra 1 (2), extra 2 (2)
ENTRY_DIMS = TOKEN_SLOTS + TAG_SLOTS


def split16(value: int) -> tuple[int, int]:
    return (value >> 8) & 0xFF, value & 0xFF


def join16(high: float, low: float) -> int:
    return (int(round(high)) << 8) | int(round(low))


def raw_c4_row(token: int, position: int, tag: Sequence[int] | None) -> list[float]:
    """The raw row [ENTRY_DIMS] a token contributes to its c4 block."""
    row = [0.0] * ENTRY_DIMS
    slot = 2 * (position % 4)
    row[slot], row[slot + 1] = split16(token)
    if tag is not None:
        kind, value, turn, extra1, extra2 = tag
        row[TOKEN_SLOTS : TOKEN_SLOTS + 8] = [
            kind, *split16(value), turn % TURNS, *split16(extra1), *split16(extra2),
        ]  # fmt: skip
    return row


def entry_tokens(entry: Sequence[float]) -> list[int]:
    """The four tokens of a compressed c4 entry (the mean of four raw rows)."""
    return [join16(4 * entry[2 * s], 4 * entry[2 * s + 1]) for s in range(4)]


def entry_tag(entry: Sequence[float]) -> tuple[int, int, int, int, int]:
    """(kind, value, turn, extra 1, extra 2) of a compressed c4 entry."""
    f = [4 * x for x in entry[TOKEN_SLOTS : TOKEN_SLOTS + 8]]
    return (
        int(round(f[0])),
        join16(f[1], f[2]),
        int(round(f[3])),
        join16(f[4], f[5]),
        join16(f[6], f[7]),
    )


def entry_tags(entries: torch.Tensor) -> torch.Tensor:
    """(kind, value, turn) [n, 3] int64 of compressed c4 entries [n, >= ENTRY_DIMS]."""
    f = torch.round(4 * entries[:, TOKEN_SLOTS : TOKEN_SLOTS + 4]).to(torch.int64)
    return torch.stack([f[:, 0], f[:, 1] * 256 + f[:, 2], f[:, 3]], dim=1)
