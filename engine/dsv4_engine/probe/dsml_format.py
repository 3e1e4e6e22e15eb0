"""The DSML formats, one table: every token and separator a valid tool-call block is made of.

Where each entry comes from (tests/unit/probe/test_dsml_format_table.py checks every entry
against these sources, so the table cannot drift from them):

* V3.2 — DeepSeek's V3.2 encoder as SGLang 0.5.23 ships it
  (`sglang/srt/entrypoints/openai/encoding_dsv32.py`) and SGLang's `DeepSeekV32Detector`.
* V4 — DeepSeek's `deepseek-recipe` (`DeepseekV4Encoding`) and SGLang's `DeepSeekV4Detector`.
* V4.1 — `deepseek-recipe` (`DeepseekV41Encoding`) and SGLang's `DeepSeekV41Detector`.

=======  ==================  ======================  ==================================
format   envelope            between marker and name  e.g. the invoke tag
=======  ==================  ======================  ==================================
v32      ``function_calls``  nothing                 ``<｜DSML｜invoke name="f">``
v4       ``tool_calls``      nothing                 ``<｜DSML｜invoke name="f">``
v41      ``calls``           one space               ``<｜DSML｜ invoke name="f">``
=======  ==================  ======================  ==================================

Shared by all three (the encoders' templates, and DeepSeek's own reference parsers
`parse_message_from_completion_text`, which refuse anything else):

* the marker ``｜DSML｜`` — U+FF5C, the letters ``DSML``, U+FF5C — a special token;
* the block follows the prose after a blank line (``\\n\\n``) and ends the turn: the next
  token is end-of-sentence;
* consecutive tags are separated by exactly one ``\\n``; an invoke without parameters
  holds ``\\n`` (deepseek-recipe's V4) or ``\\n\\n`` (the V3.2 and V4.1 encoders);
* ``<｜DSML｜invoke name="N">``; ``<｜DSML｜parameter name="P" string="true|false">VALUE``
  ``</｜DSML｜parameter>`` with ``string="true"`` values verbatim and ``"false"`` values
  one JSON literal.

One shape is accepted although DeepSeek's reference parser refuses it: the self-closing
``<｜DSML｜invoke name="N"/>`` for a call without arguments, which SGLang's detector notes
the V4 model emits, and which SGLang and deepseek-recipe both read as a call with no
arguments.  Refusing it would fail a healthy canary.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

MARKER_WORD = "DSML"
MARKER = f"｜{MARKER_WORD}｜"
EOS = "<｜end▁of▁sentence｜>"
THINK_END = "</think>"
INVOKE = "invoke"
PARAMETER = "parameter"
BLOCK_PREFIX = "\n\n"
"""Between the prose (possibly empty) and the block's opening tag."""
SEPARATOR = "\n"
"""Between two consecutive tags of the block."""
EMPTY_INVOKE_BODIES = ("\n", "\n\n")
"""What an invoke without parameters holds between its two tags."""


class DsmlFormat(StrEnum):
    V32 = "v32"
    V4 = "v4"
    V41 = "v41"

    @property
    def spelling(self) -> Spelling:
        return SPELLINGS[self]

    @property
    def envelope(self) -> str:
        return self.spelling.envelope

    @property
    def spaced(self) -> bool:
        return bool(self.spelling.space)

    def tag(self, name: str, close: bool = False) -> str:
        """The spelling of a tag's opening, e.g. ``<｜DSML｜ invoke`` for V4.1."""
        return self.spelling.tag(name, close)


@dataclass(frozen=True)
class Spelling:
    """One row of the table: how one format spells its tags."""

    fmt: DsmlFormat
    envelope: str
    space: str
    """What stands between the marker and the element name."""

    def tag(self, name: str, close: bool = False) -> str:
        return f"<{'/' if close else ''}{MARKER}{self.space}{name}"

    def closing(self, name: str) -> str:
        return self.tag(name, close=True) + ">"

    @property
    def block_open(self) -> str:
        return self.tag(self.envelope) + ">"


SPELLINGS: dict[DsmlFormat, Spelling] = {
    DsmlFormat.V32: Spelling(DsmlFormat.V32, envelope="function_calls", space=""),
    DsmlFormat.V4: Spelling(DsmlFormat.V4, envelope="tool_calls", space=""),
    DsmlFormat.V41: Spelling(DsmlFormat.V41, envelope="calls", space=" "),
}
ENVELOPE_NAMES = frozenset(s.envelope for s in SPELLINGS.values())
ELEMENT_NAMES = ENVELOPE_NAMES | {INVOKE, PARAMETER}


def render_dsml(fmt: DsmlFormat, name: str, args: dict[str, Any]) -> str:
    """One call as DeepSeek's encoder renders it (strings raw, everything else JSON): what
    an echo answer must be, and what the scripted server answers."""
    params = "".join(
        f'{fmt.tag("parameter")} name="{k}" string="{"true" if isinstance(v, str) else "false"}">'
        f"{v if isinstance(v, str) else json.dumps(v)}{fmt.tag('parameter', close=True)}>\n"
        for k, v in args.items()
    )
    return (
        f'\n\n{fmt.tag(fmt.envelope)}>\n{fmt.tag("invoke")} name="{name}">\n{params}'
        f"{fmt.tag('invoke', close=True)}>\n{fmt.tag(fmt.envelope, close=True)}>"
    )
