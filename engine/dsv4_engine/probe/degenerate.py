"""Signs that an answer is no longer language, judged from its own evidence and the request.

What a corrupted attention read produces in practice: once the lightning indexer selects
the wrong entries, decoding falls into a repetition loop, runs on past where it should
stop, emits chat-template tokens mid-answer, or drifts into tokens from unrelated text.
Each check below looks for one of these and is argued so that ordinary output — code,
markdown tables, bilingual text, and argument values in any mix of scripts — stays quiet:

* **Loops** — a unit of 2..100 characters repeated back to back at least 5 times over at
  least 60 characters; a unit shorter than 5 characters needs 12 repeats (``=`` * 40 under
  a title, "ha ha ha" are language).  A loop the request itself holds is copied, not
  degenerate.  Two shapes repeat by design and are no loop: a unit made only of DSML tags
  and whitespace (a batch of calls to one tool: its values differ, and are judged apart),
  and a drawn line — a line of up to 200 rule characters such as a markdown table's
  delimiter row (``| --- | --- |`` … one cell per column), a title's ``====`` underline,
  an ASCII table's ``+-----+-----+`` border or a code comment's ``# -----`` banner, ended
  by a line break or the value's end (a decoder stuck on one such character runs one line
  far past that, or into max_tokens; ``!!!!`` is no rule).
  Values of complete parameters are user data: they are judged only when the prompt is
  known (then a loop must come from it), otherwise the echo and schema judge them; a
  complete value that is a JSON array or object is data, whose elements may repeat.
* **Runaway** — text after the tool-call block (the format ends the turn there) is found by
  the parser; an answer that runs into max_tokens is the caller's `finish_reason` evidence.
* **Stray special tokens** — chat-template tokens (``<｜User｜>``, ``</think>``, …) in the
  answer: the tokenizer never produces them from text, only a derailed decoder does.
* **Garbled bytes** — U+FFFD, the replacement character: a detokenizer writes it where the
  decoder emitted byte tokens that form no UTF-8 character (a wrong byte-level token
  mid-character).  A model writing language never does; a request that holds one explains
  it.  Values count as for loops: only when the prompt is known, and then it must hold it.
* **Token salad** — never judged by how many scripts appear: a call may legitimately carry
  Arabic, Cyrillic, CJK, Hebrew, Greek, Latin and emoji at once, and values are not judged
  for scripts at all.  In the prose, two kinds of evidence count, each needing two words
  (one odd word is as likely a name or a quote as damage; damage confined to one word is
  the echo's to catch):

  - words that switch script inside themselves (``Lеt`` with a Cyrillic ``е``,
    ``weatherпожалуйста``) — tokens glued from unrelated vocabularies.  Latin next to CJK is
    ordinary ("GPU显存"), and a single-letter prefix is notation (``Δx``, ``μs``);
  - when the prompt is known: words in a script that neither the request (prompt, schemas,
    echo) nor the model's own languages (Latin, CJK) explain.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from itertools import groupby

from dsv4_engine.probe.context import RequestContext
from dsv4_engine.probe.dsml import Language
from dsv4_engine.probe.scripts import CJK, LATIN, script

_REPEAT = re.compile(r"(.{2,100}?)\1{4,}", re.DOTALL)
_MIN_LOOP_CHARS = 60
_MIN_SHORT_UNIT_REPEATS = 12
_SHORT_UNIT = 5
_MARKUP_ONLY = re.compile(r"[\s\x00]*")
"""What `language` leaves of tags and the layout between them: NUL per tag, whitespace."""
_RULE_CHARS = frozenset("-=_~*#+|: \t─━═│┃┼╋├┤┌┐└┘╔╗╚╝║╠╣╦╩╬")
"""What a drawn line is made of: rules, borders, table delimiters, comment banners."""
_MAX_RULE_LINE = 200
_SPECIAL = re.compile(r"<｜(?!DSML｜)[^｜<>\n]{1,40}｜>|<think>|</think>")
_REPLACEMENT = "\ufffd"
_WORD = re.compile(r"\w+")
_MODEL_SCRIPTS = frozenset({LATIN, CJK})
_MIN_SALAD_WORDS = 2


def degeneracy(answer: Language, context: RequestContext | None = None) -> str | None:
    """Why the answer is degenerate, or None when it reads as language."""
    if not answer.prose.strip() and not answer.values:
        return "empty output"
    for text in (answer.prose, *answer.values):
        if (m := _SPECIAL.search(text)) and not _explained(m[0], context):
            return f"stray special token {m[0]!r}"
    judged_values = answer.values if context is not None and context.prompt_known else ()
    for text, complete in ((answer.prose, False), *((v, True) for v in judged_values)):
        if why := _garbled(text, context):
            return why
        if not (complete and _is_data(text)) and (why := _loop(text, context, complete)):
            return why
    return _salad(answer.prose, context)


def _is_data(value: str) -> bool:
    """A JSON array or object: data, whose elements may repeat (a board of zeros, a day of
    empty counters) — a decoder stuck in one does not close it."""
    try:
        return isinstance(json.loads(value), list | dict)
    except ValueError:
        return False


def _garbled(text: str, context: RequestContext | None) -> str | None:
    if _REPLACEMENT not in text or _explained(_REPLACEMENT, context):
        return None
    at = text.index(_REPLACEMENT)
    return f"garbled bytes: {text[max(0, at - 12) : at + 12]!r} holds U+FFFD"


def _explained(fragment: str, context: RequestContext | None) -> bool:
    return context is not None and context.explains(fragment)


def _may_loop(text: str) -> bool:
    """Cheap necessary condition: a unit repeated 5 times over 60+ characters makes some
    6-gram occur at least 5 times (at the unit's period, or more often for short units)."""
    if len(text) < _MIN_LOOP_CHARS:
        return False
    grams = Counter(text[i : i + 6] for i in range(len(text) - 5))
    return grams.most_common(1)[0][1] >= 5


def _loop(text: str, context: RequestContext | None, complete: bool) -> str | None:
    """The first loop in `text`; `complete`: the text ends where its writer ended it (a
    value), not possibly where max_tokens cut it (the prose)."""
    if not _may_loop(text):
        return None
    for m in _REPEAT.finditer(text):
        unit = m[1]
        repeats = len(m[0]) // len(unit)
        if _MARKUP_ONLY.fullmatch(unit) or len(m[0]) < _MIN_LOOP_CHARS:
            continue
        if len(unit.strip()) < _SHORT_UNIT and repeats < _MIN_SHORT_UNIT_REPEATS:
            continue
        if _explained(m[0], context) or _in_drawn_line(text, m.start(), m.end(), complete):
            continue
        return f"loop: {unit!r:.40} repeated {repeats} times"
    return None


def _in_drawn_line(text: str, start: int, end: int, complete: bool) -> bool:
    """Whether text[start:end] lies within one drawn line (see the module's docstring): a
    line that ends — a run still going where the text was cut may be a loop."""
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    if line_end == -1 and not complete:
        return False
    line = text[line_start : len(text) if line_end == -1 else line_end]
    return len(line) <= _MAX_RULE_LINE and _RULE_CHARS.issuperset(line)


def _salad(prose: str, context: RequestContext | None) -> str | None:
    if prose.isascii():
        return None
    words = [w for w in _WORD.findall(prose) if not w.isascii() and not _explained(w, context)]
    mixed = [w for w in words if _switches_script(w)]
    if len(mixed) >= _MIN_SALAD_WORDS:
        return f"mixed-script words: {', '.join(mixed[:3])}"
    if context is None or not context.prompt_known:
        return None
    allowed = _MODEL_SCRIPTS | context.scripts
    foreign = [w for w in words if {s for s in map(script, w) if s} - allowed]
    if len(foreign) >= _MIN_SALAD_WORDS:
        scripts = sorted({s for w in foreign for s in map(script, w) if s} - allowed)
        return (
            f"token salad: {', '.join(foreign[:3])} in {', '.join(scripts)}, "
            "which neither the request nor the model's languages explain"
        )
    return None


def _switches_script(word: str) -> bool:
    """A word whose letters change script twice, or once between runs of 2+ letters.
    Latin and CJK together count as one (ordinary in Chinese and Japanese text)."""
    runs = [
        (key, len(list(group)))
        for key, group in groupby(
            LATIN if s == CJK else s for s in map(script, word) if s is not None
        )
    ]
    if len(runs) >= 3:
        return True
    return len(runs) == 2 and min(length for _, length in runs) >= 2
