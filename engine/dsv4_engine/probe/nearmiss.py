"""Text that looks like DSML but is not: the near misses a real parser hands the client as text.

DSML's markers are special tokens spelled exactly (`dsml.SPELLINGS`); SGLang's detectors and
deepseek-recipe look for those exact bytes.  A tag written with ASCII `|` instead of `｜`
(U+FF5C), a lower-case `dsml`, no marker at all (plain XML), or another format's element
name is therefore not a tool call to them: the call is lost and the client gets markup.
The strict parser asks this module, for every stretch of text that holds no exact marker,
whether something there is shaped like a DSML tag or marker, and if so what deviates — so
the verdict names the deviation instead of calling the text prose.  Between the block's own
tags, where no prose belongs, any tag named like a DSML element counts.

What counts as DSML-shaped: `<`, optionally a marker-like `?dsml?` (any case, any single
character or none for each bar), then one of DSML's element names.  Without a marker the
tag must also look like the element: `name="…"` on an invoke or parameter, or the envelope
names `function_calls`/`tool_calls` — so `<parameter>` or `<calls>` in an XML explanation
is not taken for a damaged call, while `<invoke name="get_weather">` is.  Outside a tag, a
marker between vertical bars (``|DSML|``) is a fragment.
Parameter values are never searched: they are user data and may hold any text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dsv4_engine.probe.dsml_format import ELEMENT_NAMES, MARKER, MARKER_WORD, Spelling

_BAR = MARKER[0]
# A bar-like character: one that is neither a letter, digit, space nor tag punctuation.
_BARISH = r"[^\sA-Za-z0-9<>/\"'=_]"
_NEAR_TAG = re.compile(
    r"<(?P<pad1>\s*)(?P<slash>/?)(?P<pad2>\s*)"
    rf"(?:(?P<lbar>{_BARISH}?)(?P<pad3>\s*)(?P<word>dsml)(?P<pad4>\s*)(?P<rbar>{_BARISH}?))?"
    rf"(?P<space>\s*)(?P<name>{'|'.join(sorted(ELEMENT_NAMES, key=len, reverse=True))})"
    r"(?![A-Za-z0-9_])(?P<rest>[^<>]{0,300})>",
    re.IGNORECASE,
)
# Outside a tag only vertical bars make a marker: "(DSML)" in prose is a word.
_BARS = "[|｜│┃∣ǀ¦︱︲￨❘]"
_NEAR_MARKER = re.compile(rf"(?P<lbar>{_BARS})\s?(?P<word>dsml)\s?(?P<rbar>{_BARS})", re.I)


@dataclass(frozen=True)
class NearMiss:
    """A DSML-shaped piece of text that is not the format's spelling."""

    text: str
    deviation: str
    is_tag: bool
    """True for a whole tag (`<…>`), False for a bare marker fragment."""


def find(text: str, spelling: Spelling, in_block: bool = False) -> NearMiss | None:
    """The first DSML-shaped tag or marker in `text` (which holds no exact marker).

    `in_block`: the text stands between the block's own tags, where there is no prose, so
    any tag named like a DSML element (``</invoke>``, ``<calls>``) is one of the block's
    tags with its marker lost — not an XML explanation."""
    for m in _NEAR_TAG.finditer(text):
        if m["word"] is None and not in_block and not _looks_like_element(m["name"], m["rest"]):
            continue
        return NearMiss(m[0], "; ".join(_tag_deviations(m, spelling)), True)
    if m := _NEAR_MARKER.search(text):
        return NearMiss(m[0], "; ".join(_marker_deviations(m)) or "a bare marker", False)
    return None


def _looks_like_element(name: str, rest: str) -> bool:
    """Without a marker, only a tag shaped like DSML's own: an invoke or parameter with its
    name attribute, or one of the two envelope names that are no ordinary word."""
    name = name.lower()
    if name in ("invoke", "parameter"):
        return 'name="' in rest
    return name in ("function_calls", "tool_calls") and rest.strip() in ("", "/")


def _tag_deviations(m: re.Match[str], spelling: Spelling) -> list[str]:
    found: list[str] = []
    if m["word"] is None:
        found.append(f"no {MARKER} marker (plain XML)")
    else:
        found += _marker_deviations(m)
        if m["pad3"] or m["pad4"]:
            found.append("whitespace inside the marker")
    if m["pad1"] or m["pad2"]:
        found.append("whitespace after '<'")
    name = m["name"]
    if name != name.lower():
        found.append(f"element {name!r} where the format spells it {name.lower()!r}")
    if m["word"] is not None and m["space"] != spelling.space:
        found.append(
            f"{m['space']!r} between the marker and the element name where "
            f"{spelling.fmt} writes {spelling.space!r}"
        )
    envelope = name.lower() not in ("invoke", "parameter")
    if envelope and name.lower() != spelling.envelope:
        found.append(
            f"envelope {name.lower()!r} where {spelling.fmt} names it {spelling.envelope!r}"
        )
    return found or ["not the format's spelling"]


def _marker_deviations(m: re.Match[str]) -> list[str]:
    found = []
    for side, bar in (("before", m["lbar"]), ("after", m["rbar"])):
        if not bar:
            found.append(f"no {_BAR!r} {side} {MARKER_WORD}")
        elif bar != _BAR:
            found.append(
                f"{bar!r} (U+{ord(bar):04X}) {side} {MARKER_WORD} where the format has "
                f"{_BAR!r} (U+{ord(_BAR):04X})"
            )
    if m["word"] != MARKER_WORD:
        found.append(f"marker word {m['word']!r} where the format has {MARKER_WORD!r}")
    return found
