"""Byte-level tokenizer: ids 0-255 are bytes, the DSV4 special tokens follow.

Why bytes: no vocabulary file to ship, every string round-trips, and a token is a
character for ASCII text, so prompt lengths are easy to reason about in tests.  Special
tokens are recognised only where the chat template says they are (its special ranges),
never inside user text, as DeepSeek's own prompt encoding does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

SPECIAL_TOKENS: tuple[str, ...] = (
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<think>",
    "</think>",
    "<｜DSML｜",
    "<tool_result>",
    "</tool_result>",
)
BYTE_TOKENS = 256
VOCAB_SIZE = BYTE_TOKENS + len(SPECIAL_TOKENS)
_SPECIAL_IDS = {s: BYTE_TOKENS + i for i, s in enumerate(SPECIAL_TOKENS)}
BOS_ID = _SPECIAL_IDS["<｜begin▁of▁sentence｜>"]
EOS_ID = _SPECIAL_IDS["<｜end▁of▁sentence｜>"]
# id -> its bytes: a special token's are its UTF-8 spelling.
_BYTES: tuple[bytes, ...] = (
    *(bytes([i]) for i in range(BYTE_TOKENS)),
    *(s.encode() for s in SPECIAL_TOKENS),
)


def special_id(spelling: str) -> int:
    return _SPECIAL_IDS[spelling]


def encode(text: str, special_ranges: Iterable[tuple[int, int]] = ()) -> list[int]:
    """Token ids of `text`; `special_ranges` ([start, end) in characters) are specials.

    A range whose spelling is not a known special token is encoded as bytes.
    """
    ids: list[int] = []
    pos = 0
    for start, end in special_ranges:
        ids += text[pos:start].encode()
        spelling = text[start:end]
        special = _SPECIAL_IDS.get(spelling)
        ids += [special] if special is not None else list(spelling.encode())
        pos = end
    ids += text[pos:].encode()
    return ids


def token_bytes(token: int) -> bytes:
    """The bytes of one token.  A character may span several tokens: decode a stream of
    them with an incremental UTF-8 decoder, never token by token."""
    return _BYTES[token]


def decode(ids: Sequence[int]) -> str:
    return b"".join(_BYTES[i] for i in ids).decode("utf-8", errors="replace")
