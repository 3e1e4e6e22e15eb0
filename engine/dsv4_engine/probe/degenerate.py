"""Signs that text is no longer language: loops, mixed-script salad, stray special tokens.

Why these three: they are what a corrupted attention read produces in practice — once the
lightning indexer selects the wrong entries, decoding falls into a repetition loop, drifts
into tokens from unrelated scripts, or emits chat-template tokens mid-answer.  Each test
is tuned to stay quiet on ordinary prose (including bilingual CJK/Latin text and markdown)
and to fire on the damage; the corpus tests hold both sides.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from functools import lru_cache

from dsv4_engine.probe.dsml import EOS, TAG

# A unit of 2..100 characters repeated back to back at least 5 times.
_REPEAT = re.compile(r"(.{2,100}?)\1{4,}", re.DOTALL)
_MIN_LOOP_CHARS = 60
_MIN_SHORT_UNIT_REPEATS = 12
_SPECIAL = re.compile(r"<｜(?!DSML｜)[^｜<>\n]{1,40}｜>|<think>|</think>")
_WORD = re.compile(r"\w+")
_CJK_FAMILY = frozenset({"CJK", "HIRAGANA", "KATAKANA", "HANGUL", "FULLWIDTH", "HALFWIDTH"})
_MAX_SCRIPTS = 3
_NOT_LETTERS = "0123456789_"


def degeneracy(text: str) -> str | None:
    """Why `text` (reasoning split off) is degenerate, or None when it reads as language."""
    body = text.removesuffix(EOS)
    if not body.strip():
        return "empty output"
    if m := _SPECIAL.search(body):
        return f"stray special token {m[0]!r}"
    # Each well-formed DSML tag counts as one character: tags legitimately repeat.
    language = TAG.sub("\x00", body)
    return _loop(language) or _salad(language)


def _may_loop(text: str) -> bool:
    """Cheap necessary condition: a unit repeated 5 times over 60+ characters makes some
    6-gram occur at least 5 times (at the unit's period, or more often for short units)."""
    grams = Counter(text[i : i + 6] for i in range(len(text) - 5))
    return bool(grams) and grams.most_common(1)[0][1] >= 5


def _loop(text: str) -> str | None:
    if not _may_loop(text):
        return None
    for m in _REPEAT.finditer(text):
        unit = m[1]
        repeats = len(m[0]) // len(unit)
        if unit.strip() == "" or len(m[0]) < _MIN_LOOP_CHARS:
            continue
        if len(unit.strip()) < 5 and repeats < _MIN_SHORT_UNIT_REPEATS:
            continue
        return f"loop: {unit!r:.40} repeated {repeats} times"
    return None


@lru_cache(maxsize=4096)
def _script(char: str) -> str | None:
    """The script family of a letter (first word of its Unicode name), None for non-letters."""
    if not char.isalpha():
        return None
    name = unicodedata.name(char, "")
    first = name.split(" ", 1)[0]
    return "CJK" if first in _CJK_FAMILY else first or None


def _salad(text: str) -> str | None:
    """Words that mix alphabets, or more alphabets than any one answer plausibly needs.

    Latin next to CJK inside one word is normal in Chinese and Japanese technical text
    ("GPU显存"), so that pair is not counted; Latin inside a Cyrillic word is not.
    """
    if text.isascii():
        return None
    scripts: set[str] = set()
    mixed_words = []
    for word in _WORD.findall(text):
        if word.isascii():
            if word.strip(_NOT_LETTERS):
                scripts.add("LATIN")
            continue
        in_word = {s for s in map(_script, word) if s}
        scripts |= in_word
        if {"CJK", "LATIN"} <= in_word:
            in_word.discard("CJK")
        if len(in_word) > 1:
            mixed_words.append(word)
    if len(mixed_words) >= 2:
        return f"mixed-script words: {', '.join(mixed_words[:3])}"
    if len(scripts) > _MAX_SCRIPTS:
        return f"mixed-script salad: {len(scripts)} scripts ({', '.join(sorted(scripts))})"
    return None
