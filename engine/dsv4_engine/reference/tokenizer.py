"""Byte-level tokenizer: ids 0-255 are bytes, the DSV4 special tokens follow, then the
pieces of DSML tool-call markup.

Why bytes: no vocabulary file to ship, every string round-trips, and a token is a
character for ASCII text, so prompt lengths are easy to reason about in tests.  Special
tokens are recognised only where the chat template says they are (its special ranges),
never inside user text, as DeepSeek's own prompt encoding does.

Why pieces: DeepSeek's BPE vocabulary spells a tool call's markup in a few tokens (the
probes' echo call is about 100 of them), bytes in several hundred, which would make a
model that writes tool calls four times slower here than the real one.  A model may
write each piece of the V4 markup (`PIECES`: a tag's opening, a closing tag, an
attribute's spelling) as one token (`encode_output`).  Prompts stay bytes (`encode`): the
echo model's reader reads them byte by byte, and an output token means the same text as
its bytes, as a BPE merge does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from dsv4_engine.probe.dsml_format import BLOCK_PREFIX, INVOKE, PARAMETER, DsmlFormat

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
TOOL_CALL_FORMAT = DsmlFormat.V4  # what the chat template (deepseek-recipe's V4) asks for
_V4 = TOOL_CALL_FORMAT.spelling
PIECES: tuple[str, ...] = (
    BLOCK_PREFIX,
    _V4.block_open,
    _V4.tag(INVOKE),
    _V4.tag(PARAMETER),
    _V4.closing(PARAMETER),
    _V4.closing(INVOKE),
    _V4.closing(_V4.envelope),
    ' name="',
    '" string="',
    'true">',
    'false">',
    '">',
)
BYTE_TOKENS = 256
PIECES_AT = BYTE_TOKENS + len(SPECIAL_TOKENS)
VOCAB_SIZE = PIECES_AT + len(PIECES)
_SPECIAL_IDS = {s: BYTE_TOKENS + i for i, s in enumerate(SPECIAL_TOKENS)}
BOS_ID = _SPECIAL_IDS["<｜begin▁of▁sentence｜>"]
EOS_ID = _SPECIAL_IDS["<｜end▁of▁sentence｜>"]
# id -> its bytes: a special token's and a piece's are their UTF-8 spelling.
_BYTES: tuple[bytes, ...] = (
    *(bytes([i]) for i in range(BYTE_TOKENS)),
    *(s.encode() for s in (*SPECIAL_TOKENS, *PIECES)),
)
# What output text may be written as one token, longest first (a piece may begin with a
# special token: `<｜DSML｜invoke` with the marker).
_OUTPUT_IDS = sorted(
    [*_SPECIAL_IDS.items(), *((p, PIECES_AT + i) for i, p in enumerate(PIECES))],
    key=lambda item: -len(item[0]),
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


def encode_output(text: str) -> list[int]:
    """Token ids a model writes `text` as: each piece and special token one token (the
    longest that fits, left to right), everything else bytes."""
    ids: list[int] = []
    pos = 0
    while pos < len(text):
        for spelling, token in _OUTPUT_IDS:
            if text.startswith(spelling, pos):
                ids.append(token)
                pos += len(spelling)
                break
        else:
            ids += text[pos].encode()
            pos += 1
    return ids


def token_bytes(token: int) -> bytes:
    """The bytes of one token.  A character may span several tokens: decode a stream of
    them with an incremental UTF-8 decoder, never token by token."""
    return _BYTES[token]


def decode(ids: Sequence[int]) -> str:
    return b"".join(_BYTES[i] for i in ids).decode("utf-8", errors="replace")
