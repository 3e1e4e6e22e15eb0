"""A mutation engine for completions: what a corrupted attention read does to a token stream.

When the lightning indexer picks the wrong KV entries, the next token is decoded from the
wrong context: it repeats the previous token, copies one from nearby or from elsewhere in
the prompt, re-emits a span it already wrote or skips one, garbles a special token (the
DSML marker) into its look-alike bytes, or the answer runs into the token limit.  Each
`Mutation` below is one such event, applied to the completion's token stream.

Tokens: DeepSeek's tokenizer (`tokenizer.json`) is not available offline, so the stream is
cut the way its pre-tokenizer and merges cut it in the large: special tokens whole (the
marker ``｜DSML｜``, end-of-sentence, ``</think>``), runs of letters in pieces of up to six,
digits in groups of up to three, punctuation one character at a time, whitespace runs
whole.  Mutations act on whole tokens, as decoding does.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from dsv4_engine.probe.dsml_format import EOS, MARKER, THINK_END

SPECIAL_TOKENS = (MARKER, EOS, THINK_END, "<think>")
_SPECIAL = re.compile("(" + "|".join(map(re.escape, SPECIAL_TOKENS)) + ")")
_PIECE = re.compile(r"\s+|[^\W\d_]{1,6}|\d{1,3}|[\W_]", re.UNICODE)
MARKER_RESPELLINGS = ("|DSML|", "｜dsml｜", "DSML｜", "｜DSML", "| DSML |", "")
"""Look-alikes of the marker token: ASCII bars, lower case, a bar lost, spaced, dropped."""


def tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    for part in _SPECIAL.split(text):
        if part in SPECIAL_TOKENS:
            tokens.append(part)
        elif part:
            tokens.extend(_PIECE.findall(part))
    return tokens


class Kind(StrEnum):
    REPEAT_PREVIOUS = "token replaced by the previous one"
    NEARBY = "token replaced by a nearby one"
    FROM_CONTEXT = "token replaced by one from the prompt"
    DUPLICATE_SPAN = "span duplicated"
    DROP_SPAN = "span dropped"
    MARKER_BYTE = "a byte of a special token altered"
    MARKER_RESPELLED = "special token respelled as a look-alike"
    TRUNCATE = "stream cut off"


@dataclass(frozen=True)
class Mutation:
    kind: Kind
    at: int
    """Token index (for the special-token kinds: which special token of the region)."""
    size: int = 1
    """Span length, distance to the nearby token, context token index, byte index …"""
    value: int = 0
    """A second parameter: the XOR mask of a byte, which look-alike."""

    def apply(self, tokens: Sequence[str], context: Sequence[str]) -> list[str]:
        t, i = list(tokens), self.at
        match self.kind:
            case Kind.REPEAT_PREVIOUS:
                t[i] = t[i - 1]
            case Kind.NEARBY:
                t[i] = t[min(len(t) - 1, max(0, i + self.size))]
            case Kind.FROM_CONTEXT:
                t[i] = context[self.size % len(context)]
            case Kind.DUPLICATE_SPAN:
                t[i + self.size : i + self.size] = t[i : i + self.size]
            case Kind.DROP_SPAN:
                del t[i : i + self.size]
            case Kind.MARKER_BYTE:
                raw = bytearray(t[i].encode())
                raw[self.size % len(raw)] ^= self.value
                t[i] = raw.decode(errors="replace")
            case Kind.MARKER_RESPELLED:
                t[i] = MARKER_RESPELLINGS[self.value % len(MARKER_RESPELLINGS)]
            case Kind.TRUNCATE:
                del t[i:]
        return t
