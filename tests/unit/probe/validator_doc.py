"""The generated sections of docs/tool-call-validation.md: the validator-vs-SGLang table and
the per-class scores on the combined corpus.  Regenerate with
`$VENV/bin/python -m tests.unit.probe.validator_doc`; test_tool_call_validation_doc.py fails
when the committed page differs from what this module generates.

Agreement rule, per corpus case: the validator and SGLang agree when the validator says
VALID and SGLang serves exactly the calls the validator read (none for a prose answer), or
when the validator refuses the answer and SGLang serves no call.  Everything else is a
disagreement, and every disagreement needs its reason in `WHY` (keyed by the corpus edit).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from dsv4_engine.probe.dsml import DsmlFormat, parse, split_reasoning
from dsv4_engine.probe.scores import score
from dsv4_engine.probe.validate import Judged, classify_records
from tests.unit.probe.served_parsers import SGLANG_PARSERS, Served, sglang_serve

ROOT = Path(__file__).resolve().parents[3]
CORPUS = ROOT / "tests" / "data" / "dsml_corpus"
DOC = ROOT / "docs" / "tool-call-validation.md"

_ECHO = (
    "the echo asked for other values; SGLang cannot know what was asked and serves the damaged call"
)
_SCHEMA = "SGLang does not check arguments against the tool's schema; the client gets a call its tool rejects"
_PROSE = (
    "SGLang serves the call and passes the prose on; the prose shows the decoder left language "
    "in this very answer, so the call beside it is no evidence of a healthy engine"
)
_REASONING = (
    "SGLang serves the call and passes the reasoning on; the reasoning shows the decoder left "
    "language in this very turn, so the call after it is no evidence of a healthy engine"
)
_LAYOUT = (
    "SGLang's regexes ignore layout; DeepSeek's reference parser requires it and no encoder "
    "writes otherwise: a lost newline token means a disturbed stream"
)
WHY: dict[str, str] = {
    "limits": (
        "SGLang strips string values (`strip_string_param_value`), losing the label's leading and "
        "trailing spaces; the encoder wrote them and deepseek-recipe reads them verbatim"
    ),
    "fragment_in_prose": "the client's content carries the raw marker; a special token mid-sentence is off-format",
    "ascii_fragment_in_prose": "the client's content carries a marker look-alike, what a garbled special token becomes",
    "markup_in_reasoning": "SGLang parses only the answer; a call begun while thinking reaches the client as reasoning text",
    "ascii_markup_in_reasoning": "SGLang parses only the answer; a call begun while thinking, in a marker look-alike, is lost",
    "parameter_after_block": "the format ends the turn at the block; a parameter after it is the model running on",
    "second_block_after": "SGLang serves both blocks: a repeated block becomes a repeated call (double side effects)",
    "extra_invoke_close": "SGLang ignores the stray closing tag; a duplicated tag is a duplicated token span",
    "invoke_not_closed": "SGLang drops the unclosed invoke and serves the other call alone: a call silently lost",
    "stray_text_between_invokes": "SGLang ignores prose between invokes; words inside the block are damage",
    "bare_invoke": "SGLang's fallback reads invokes without the envelope; no encoder writes it, a lost envelope token",
    "other_format_envelope": "SGLang falls back to the bare invoke; the envelope is another format's (wrong model or --format)",
    "json_body": (
        "SGLang reads a JSON body ('format 2'), deepseek-recipe (SGLang's dsv4 chat encoding) reads {} "
        "from it: the same answer loses its arguments on the other serving path; no encoder writes it"
    ),
    "no_blank_line_before_block": _LAYOUT,
    "no_newline_between_tags": _LAYOUT,
    "extra_property": _SCHEMA,
    "integer_as_string": _SCHEMA,
    "missing_required": _SCHEMA,
    "non_json_literal": 'SGLang serves the text `48O213` where string="false" and the schema promise a number',
    "boolean_flipped": _ECHO,
    "count_digit_changed": _ECHO,
    "emoji_dropped": _ECHO,
    "id_char_dropped": _ECHO,
    "id_char_substituted": _ECHO,
    "multilingual_char_changed": _ECHO,
    "padding_stripped": _ECHO + " (and SGLang would strip the padding even from the intact call)",
    "call_repeated": _ECHO + ", twice",
    "loop_in_prose": _PROSE,
    "punctuation_run": _PROSE,
    "script_salad": _PROSE,
    "stray_special_token": _PROSE,
    "foreign_scripts_not_in_request": _PROSE,
    "loop_in_closed_value": "SGLang serves a looped city the request does not hold",
    "runaway_after_block": "SGLang drops text after the block; the model did not end its turn where the format does",
    "long_period_loop_in_prose": _PROSE,
    "replacement_run_in_prose": _PROSE,
    "loop_in_reasoning": _REASONING,
    "long_period_loop_in_reasoning": _REASONING,
    "replacement_run_in_reasoning": _REASONING,
    "role_token_in_reasoning": _REASONING,
    "assistant_token_in_reasoning": _REASONING,
    "dialect_in_reasoning": (
        "SGLang parses only the answer; a call begun while thinking, in another family's "
        "dialect, reaches the client as reasoning text"
    ),
    "invoke_cycle": "SGLang serves every copy: a decoder stuck in the block makes one call three times (its side effects thrice)",
    "invoke_cycle_of_two": "SGLang serves every copy: a cycle of two calls makes each of them twice",
    "long_period_loop_in_value": "SGLang serves a log whose lines loop back, which the request does not hold",
    "replacement_run_in_value": "SGLang serves a city with bytes that form no character, which the request does not hold",
}


@dataclass(frozen=True)
class Case:
    fmt: DsmlFormat
    edit: str
    judged: Judged
    served: Served
    agree: bool


def crosscheck() -> list[Case]:
    """Every corpus case through the validator and through SGLang's served parser."""
    cases = []
    for fmt in DsmlFormat:
        path = CORPUS / f"corpus_{fmt}.jsonl"
        lines = path.read_text().splitlines()
        for line, judged in zip(lines, classify_records(lines, fmt, path.name), strict=True):
            row = json.loads(line)
            served = sglang_serve(row["text"], fmt, row["tools"])
            if judged.judgement.valid:
                read = parse(split_reasoning(row["text"])[1], fmt)
                agree = served.calls == tuple((c.name, c.args) for c in read)
            else:
                agree = not served.calls
            cases.append(Case(fmt, row["edit"], judged, served, agree))
    return cases


def disagreement_table(cases: list[Case]) -> str:
    grouped: dict[tuple[str, str, str, str], list[str]] = defaultdict(list)
    for c in cases:
        if not c.agree:
            key = (c.edit, c.judged.label or "", c.judged.judgement.outcome, c.served.describe())
            grouped[key].append(c.fmt.value)
    lines = [
        "| corpus case | label | validator | SGLang serves | formats | why the validator is right |",
        "|---|---|---|---|---|---|",
    ]
    for (edit, label, outcome, served), formats in sorted(grouped.items()):
        lines.append(
            f"| `{edit}` | {label} | {outcome} | {served} | {', '.join(formats)} | {WHY[edit]} |"
        )
    agreed = sum(c.agree for c in cases)
    parsers = ", ".join(f"`{p}`" for p in SGLANG_PARSERS.values())
    lines.append("")
    lines.append(
        f"{len(cases)} corpus cases through SGLang 0.5.23's {parsers}: {agreed} agree, "
        f"{len(cases) - agreed} disagree (the rows above)."
    )
    return "\n".join(lines)


def scores_table(cases: list[Case]) -> str:
    lines = ["| class | labelled | judged | precision | recall |", "|---|---|---|---|---|"]
    for s in score((c.judged.label, c.judged.judgement.outcome) for c in cases):
        precision = "-" if s.precision is None else f"{s.precision:.1%}"
        recall = "-" if s.recall is None else f"{s.recall:.1%}"
        lines.append(f"| {s.outcome} | {s.labelled} | {s.judged} | {precision} | {recall} |")
    return "\n".join(lines)


def sections(cases: list[Case] | None = None) -> dict[str, str]:
    cases = crosscheck() if cases is None else cases
    assert all(c.judged.label is not None for c in cases)
    return {"crosscheck": disagreement_table(cases), "scores": scores_table(cases)}


def _block(name: str) -> re.Pattern[str]:
    return re.compile(
        rf"(<!-- BEGIN GENERATED {name} -->\n)(.*?)(\n<!-- END GENERATED {name} -->)", re.S
    )


def committed(name: str) -> str:
    match = _block(name).search(DOC.read_text())
    assert match, f"{DOC.name} has no generated section {name!r}"
    return match[2]


def main() -> None:
    text = DOC.read_text()
    for name, body in sections().items():
        text = _block(name).sub(lambda m, body=body: m[1] + body + m[3], text)
    DOC.write_text(text)


if __name__ == "__main__":
    main()
