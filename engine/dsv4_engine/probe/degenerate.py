"""Signs that an answer is no longer language, judged from its own evidence and the request.

What a corrupted attention read produces in practice: once the lightning indexer selects
the wrong entries, decoding falls into a repetition loop, runs on past where it should
stop, emits chat-template tokens mid-answer, or drifts into tokens from unrelated text.
Each check below looks for one of these and is argued so that ordinary output — code,
markdown tables, bilingual text, and argument values in any mix of scripts — stays quiet:

* **Loops** — a unit of up to 400 characters repeated back to back.  Language repeats
  short spans ("ha ha ha", one phrase per list item, a log line or two) but almost never
  copies a long span from right behind itself, so the longer the unit, the fewer repeats
  prove a loop: at least 5 repeats over at least 60 characters, or at least 3 repeats
  that copy at least 200 characters (a unit of 100+ characters three times, of 67+ four
  times); a unit with fewer than 5 visible characters needs 12 repeats (``=`` * 40 under
  a title, "ha ha ha" are language).  Three repeats, not two: a sentence said twice is a
  stutter people write too.  A loop the request itself holds is copied, not degenerate.
  Shapes that repeat by design are no loop: a unit made only of DSML tags and whitespace
  (a batch of calls to one tool: its values differ, and are judged apart), and drawn
  lines — lines of up to 200 rule characters such as a markdown table's delimiter row
  (``| --- | --- |`` … one cell per column), a title's ``====`` underline, an ASCII
  table's ``+-----+-----+`` border, a code comment's ``# -----`` banner or an empty
  table's ``|   |   |`` rows, ended by a line break or the value's end (a decoder stuck
  on one such character runs one line far past that, or into max_tokens; ``!!!!`` is no
  rule).  Rows of data that differ in a date, a counter or an id (CSV, logs, tables)
  copy less than a unit each time and are no loop.
  Values of complete parameters are user data: they are judged only when the prompt is
  known (then a loop must come from it), otherwise the echo and schema judge them — a
  user's pasted file may hold any repetition, and without the prompt the judge cannot
  tell it from the decoder's.  A loop inside a closed JSON array or object — a value that
  is one, or one written out in the prose or the reasoning — is data, whose elements may
  repeat (a decoder stuck in one does not close it).  The reasoning is language the model
  wrote: a loop counts there as in the prose.
* **Cycles of calls** — the same sequence of calls, with the same arguments, back to back
  so that at least 3 calls repeat (one call three times, two calls twice): a decoder
  stuck in the block copies whole invokes.  A batch of calls to one tool differs in its
  arguments and is no cycle; nor is one call made twice (a die rolled twice; the echo
  catches a call repeated where one was asked for), nor calls without arguments (a tool
  that takes none can only be called the same way: ping it three times).
* **Runaway** — text after the tool-call block (the format ends the turn there) is found by
  the parser; an answer that runs into max_tokens is the caller's `finish_reason` evidence.
* **Stray special tokens** — chat-template tokens (``<｜User｜>``, ``</think>``, …) in the
  answer, its values or the reasoning: the tokenizer never produces them from text, only
  a derailed decoder does.
* **Garbled bytes** — U+FFFD, the replacement character, one or a run: a detokenizer
  writes it where the decoder emitted byte tokens that form no UTF-8 character (a wrong
  byte-level token mid-character).  A model writing language never does, in the answer or
  the reasoning; a request that holds one explains it.  Values count as for loops: only
  when the prompt is known, and then it must hold it (a pasted binary file is runs of
  U+FFFD, and only the prompt tells whose they are).
* **Token salad** — judged in the prose only (the reasoning is a scratchpad of notation,
  ``θ``, ``Δ``, and quotes, which script evidence cannot tell from salad); never judged by
  how many scripts appear: a call may legitimately carry Arabic, Cyrillic, CJK, Hebrew,
  Greek, Latin and emoji at once, and values are not judged for scripts at all.  In the prose, two kinds of evidence count, each needing two words
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
from collections.abc import Callable, Iterator, Sequence
from itertools import groupby
from typing import NamedTuple

from dsv4_engine.probe.context import RequestContext
from dsv4_engine.probe.dsml import Language, ToolCall
from dsv4_engine.probe.scripts import CJK, LATIN, script

_MAX_PERIOD = 400
_MIN_LOOP_CHARS = 60
_MIN_REPEATS = 5
_MIN_LONG_REPEATS = 3
_MIN_COPIED_CHARS = 200
"""What a long unit's repeats after the first must cover (3 repeats of 100+ characters)."""
_MIN_SHORT_UNIT_REPEATS = 12
_SHORT_UNIT = 5
_MIN_COPY = min(
    _MIN_LOOP_CHARS * (_MIN_REPEATS - 1) // _MIN_REPEATS,
    _MIN_LOOP_CHARS * (_MIN_SHORT_UNIT_REPEATS - 1) // _MIN_SHORT_UNIT_REPEATS,
    _MIN_COPIED_CHARS,
)
"""The least any loop the thresholds accept copies from one period earlier: 5 repeats
over 60 characters copy 48, 12 over 60 copy 55, a long unit 200."""
_PROBE = (_MIN_COPY + 1) // 2
"""The loop search's probe length and spacing, 24: a copy of 48 characters holds one of
the probes aligned every 24 characters, and that probe recurs one period earlier."""
_MARKUP_ONLY = re.compile(r"[\s\x00]*")
"""What `language` leaves of tags and the layout between them: NUL per tag, whitespace."""
_RULE_CHARS = frozenset("-=_~*#+|: \t─━═│┃┼╋├┤┌┐└┘╔╗╚╝║╠╣╦╩╬")
"""What a drawn line is made of: rules, borders, table delimiters, comment banners."""
_MAX_RULE_LINE = 200
_JSON = json.JSONDecoder()
_MAX_DATA_OPENINGS = 16
"""Opening brackets tried around a loop: a structure nested deeper is not judged data."""
_MIN_CYCLE_CALLS = 3
_MAX_CYCLE_UNIT = 32
"""The longest sequence of calls searched for a cycle, which bounds the search on an
answer of thousands of calls."""
_SPECIAL = re.compile(r"<｜(?!DSML｜)[^｜<>\n]{1,40}｜>|<think>|</think>")
_REPLACEMENT = "\ufffd"
_WORD = re.compile(r"\w+")
_MODEL_SCRIPTS = frozenset({LATIN, CJK})
_MIN_SALAD_WORDS = 2


def degeneracy(answer: Language, context: RequestContext | None = None) -> str | None:
    """Why the answer (its reasoning, prose and values) is degenerate, or None when it reads
    as language."""
    for text in (answer.reasoning, answer.prose, *answer.values):
        if (m := _SPECIAL.search(text)) and not _explained(m[0], context):
            return f"stray special token {m[0]!r}"
    judged_values = answer.values if context is not None and context.prompt_known else ()
    spoken = ((answer.reasoning, False), (answer.prose, False))
    for text, complete in (*spoken, *((v, True) for v in judged_values)):
        if why := _garbled(text, context) or _loop(text, context, complete):
            return why
    return _salad(answer.prose, context)


def _garbled(text: str, context: RequestContext | None) -> str | None:
    if _REPLACEMENT not in text or _explained(_REPLACEMENT, context):
        return None
    at = text.index(_REPLACEMENT)
    return f"garbled bytes: {text[max(0, at - 12) : at + 12]!r} holds U+FFFD"


def _explained(fragment: str, context: RequestContext | None) -> bool:
    return context is not None and context.explains(fragment)


class _Repeat(NamedTuple):
    """text[start:end] repeats its first `period` characters back to back."""

    start: int
    end: int
    period: int

    @property
    def repeats(self) -> int:
        return (self.end - self.start) // self.period


def _loop(text: str, context: RequestContext | None, complete: bool) -> str | None:
    """The first loop in `text`; `complete`: the text ends where its writer ended it (a
    value), not possibly where max_tokens cut it (the prose)."""
    for found in _repeats(text):
        unit = text[found.start : found.start + found.period]
        if not _is_loop(unit, found.repeats) or _MARKUP_ONLY.fullmatch(unit):
            continue
        region = text[found.start : found.end]
        if _explained(region, context) or _in_drawn_lines(text, found, complete):
            continue
        if _in_data(text, found):
            continue
        return f"loop: {unit!r:.40} repeated {found.repeats} times"
    return None


def _is_loop(unit: str, repeats: int) -> bool:
    """The thresholds of the module's docstring, by the unit's length."""
    if len(unit.strip()) < _SHORT_UNIT:
        return repeats >= _MIN_SHORT_UNIT_REPEATS and repeats * len(unit) >= _MIN_LOOP_CHARS
    if repeats >= _MIN_REPEATS and repeats * len(unit) >= _MIN_LOOP_CHARS:
        return True
    return repeats >= _MIN_LONG_REPEATS and (repeats - 1) * len(unit) >= _MIN_COPIED_CHARS


def _repeats(text: str) -> Iterator[_Repeat]:
    """Stretches of `text` that may repeat a unit of up to 400 characters 3 times or more,
    left to right, in near-linear time.  Per probe (see `_PROBE`), one `rfind` over the
    423 characters before it: most text has no 24 characters recur that close, the cheap
    necessary condition.  Where they do, the distance to the nearest earlier occurrence is
    the candidate period, kept only where the text agrees with itself that far back over
    enough characters past the probe on one side (`_may_loop`: two slice comparisons,
    which rows alike but for a date or a counter, a log or a CSV file, fail), and then
    grown both ways by comparing slices: a loop of any length costs about two passes over
    it.  The nearest occurrence alone suffices: a unit that holds some 24 characters twice
    puts a shorter distance first at a probe there, but a loop copies two units at least,
    and the probes across the ends of the part it repeats recur first at the period.  A
    probe inside a stretch already found is skipped: what repeats there repeats with that
    stretch's period (Fine and Wilf), so a run of spaces costs one probe, not one per 24
    characters.  `test_validator_production_shapes` checks the search against one of
    every period at every position."""
    covered = 0
    for at in range(_PROBE, len(text) - _PROBE + 1, _PROBE):
        if at + _PROBE <= covered:
            continue
        low = at - _MAX_PERIOD if at > _MAX_PERIOD else 0
        hit = text.rfind(text[at : at + _PROBE], low, at + _PROBE - 1)
        if hit != -1 and _may_loop(text, at, at - hit):
            found = _stretch(text, at, at - hit)
            covered = found.end
            yield found


def _may_loop(text: str, at: int, shift: int) -> bool:
    """Whether the text agrees with itself `shift` earlier right before or right after the
    probe at `at` over half of what a loop at that period copies beyond the probe: a loop
    copies `_MIN_COPY` characters at least, and two units (3 repeats) — so the copy that
    holds the probe reaches that far past it on one side."""
    margin = (max(_MIN_COPY, 2 * shift) - _PROBE + 1) // 2
    end = at + _PROBE + margin
    if end <= len(text) and text[at + _PROBE : end] == text[at + _PROBE - shift : end - shift]:
        return True
    start = at - margin
    return start - shift >= 0 and text[start:at] == text[start - shift : at - shift]


def _stretch(text: str, at: int, shift: int) -> _Repeat:
    """The longest stretch around `at` where every character equals the one `shift`
    earlier, with its first unit; its period is the unit's smallest one."""
    after = _agreeing(
        lambda i, j: text[at + i : at + j] == text[at - shift + i : at - shift + j],
        len(text) - at,
    )
    before = _agreeing(
        lambda i, j: text[at - j : at - i] == text[at - shift - j : at - shift - i],
        at - shift,
    )
    start = at - before - shift
    unit = text[start : start + shift]
    return _Repeat(start, at + after, (unit + unit).find(unit, 1))


def _agreeing(same: Callable[[int, int], bool], limit: int) -> int:
    """The largest n ≤ limit with same(0, n), where same(i, j) compares characters i..j of
    the two sides: galloping, then halving the step — each character compared a few times."""
    n, step = 0, 64
    while n < limit:
        step = min(step, limit - n)
        if same(n, n + step):
            n, step = n + step, step * 2
        elif step == 1:
            break
        else:
            step //= 2
    return n


def _in_data(text: str, found: _Repeat) -> bool:
    """Whether the stretch lies inside a closed JSON array or object — a value that is one,
    or one written out in the prose or the reasoning: data, whose elements may repeat (a
    board of zeros, a day of empty counters); a decoder stuck in one does not close it.
    Tried from the nearest opening bracket before the stretch outwards, a few of them."""
    opening = found.start + 1
    for _ in range(_MAX_DATA_OPENINGS):
        opening = max(text.rfind("[", 0, opening), text.rfind("{", 0, opening))
        if opening == -1:
            return False
        try:
            _, end = _JSON.raw_decode(text, opening)
        except ValueError:
            continue
        if end >= found.end:
            return True
    return False


def _in_drawn_lines(text: str, found: _Repeat, complete: bool) -> bool:
    """Whether the stretch lies within drawn lines (see the module's docstring) that end —
    a run still going where the text was cut may be a loop."""
    lines_start = text.rfind("\n", 0, found.start) + 1
    lines_end = text.find("\n", found.end)
    if lines_end == -1 and not complete:
        return False
    lines = text[lines_start : len(text) if lines_end == -1 else lines_end].split("\n")
    return all(len(line) <= _MAX_RULE_LINE and _RULE_CHARS.issuperset(line) for line in lines)


def call_cycle(calls: Sequence[ToolCall]) -> str | None:
    """Why `calls` hold a cycle (see the module's docstring), or None: a run where each call
    repeats the one `size` calls earlier, arguments and all."""
    keys = [(c.name, json.dumps(c.args, sort_keys=True, ensure_ascii=False)) for c in calls]
    for size in range(1, min(len(keys) // 2, _MAX_CYCLE_UNIT) + 1):
        run = 0
        for i in range(size, len(keys)):
            run = run + 1 if keys[i] == keys[i - size] else 0
            if run < size or run + size < _MIN_CYCLE_CALLS:
                continue
            unit = calls[i - run - size + 1 : i - run + 1]
            if any(c.args for c in unit):
                names = ", ".join(c.name for c in unit)
                return f"cycle of calls: ({names}) repeated {run // size + 1} times, same arguments"
    return None


def _salad(prose: str, context: RequestContext | None) -> str | None:
    """Each distinct word judged once (a long answer repeats its words), counted as often
    as it occurs."""
    if prose.isascii():
        return None
    counts = Counter(w for w in _WORD.findall(prose) if not w.isascii())
    words = {w: n for w, n in counts.items() if not _explained(w, context)}
    mixed = [w for w in words if _switches_script(w)]
    if sum(words[w] for w in mixed) >= _MIN_SALAD_WORDS:
        return f"mixed-script words: {', '.join(mixed[:3])}"
    if context is None or not context.prompt_known:
        return None
    allowed = _MODEL_SCRIPTS | context.scripts
    foreign = [w for w in words if {s for s in map(script, w) if s} - allowed]
    if sum(words[w] for w in foreign) >= _MIN_SALAD_WORDS:
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
