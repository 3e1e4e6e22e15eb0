"""The writing system of a letter: the unit the token-salad judge reasons in.

The script is the first word of the letter's Unicode name (LATIN, CYRILLIC, ARABIC, …).
Chinese, Japanese and Korean count as one family, CJK: DeepSeek's own training languages
mix them with Latin in ordinary technical text.  Letter-like symbols whose names start
with a style rather than a script (MATHEMATICAL BOLD …, CIRCLED …, MICRO SIGN) are not
letters of any script.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache

_CJK_FAMILY = frozenset(
    {"CJK", "HIRAGANA", "KATAKANA", "HANGUL", "BOPOMOFO", "FULLWIDTH", "HALFWIDTH"}
)
_STYLES = frozenset(
    {
        "BLACK-LETTER",
        "CIRCLED",
        "DOUBLE-STRUCK",
        "FEMININE",
        "MASCULINE",
        "MATHEMATICAL",
        "MICRO",
        "MODIFIER",
        "NEGATIVE",
        "PARENTHESIZED",
        "SCRIPT",
        "SMALL",
        "SQUARED",
        "SUBSCRIPT",
        "SUPERSCRIPT",
        "TURNED",
    }
)
CJK = "CJK"
LATIN = "LATIN"


@lru_cache(maxsize=8192)
def script(char: str) -> str | None:
    """The script family of one character, None when it is not a letter of a script."""
    if not char.isalpha():
        return None
    first = unicodedata.name(char, "").split(" ", 1)[0]
    if not first or first in _STYLES:
        return None
    return CJK if first in _CJK_FAMILY else first


def scripts_of(text: str) -> frozenset[str]:
    return frozenset(s for s in map(script, set(text)) if s)
