"""The format table (dsml_format.SPELLINGS and the shared layout) is what the formats' own
definitions say: SGLang 0.5.23's detectors for each `--tool-call-parser`, DeepSeek's
encoders (deepseek-recipe for V4/V4.1, encoding_dsv32 for V3.2) and their special tokens."""

import json
from pathlib import Path

import deepseek_recipe as dr
import pytest

from dsv4_engine.probe.dsml_format import (
    BLOCK_PREFIX,
    EMPTY_INVOKE_BODIES,
    EOS,
    INVOKE,
    MARKER,
    PARAMETER,
    SEPARATOR,
    THINK_END,
    DsmlFormat,
)
from tests.unit.probe.encoders import render
from tests.unit.probe.served_parsers import SGLANG_PARSERS, recipe_serve

pytestmark = pytest.mark.sglang


def test_special_tokens_are_deepseeks():
    from sglang.srt.entrypoints.openai import encoding_dsv32

    assert MARKER == dr.SpecialToken.Dsml.default_str() == encoding_dsv32.dsml_token
    assert EOS == dr.SpecialToken.Eos.default_str() == encoding_dsv32.eos_token
    assert THINK_END == dr.SpecialToken.ThinkingEnd.default_str()
    assert [ord(c) for c in MARKER] == [0xFF5C, *map(ord, "DSML"), 0xFF5C]


@pytest.mark.parametrize("fmt", list(DsmlFormat))
def test_the_table_row_is_the_detector_sglang_serves_for_the_format(fmt):
    from sglang.srt.function_call.function_call_parser import FunctionCallParser

    detector = FunctionCallParser.ToolCallParserEnum[SGLANG_PARSERS[fmt]]
    spelling = fmt.spelling
    assert detector.dsml_token == MARKER
    assert detector.tool_calls_block_name == spelling.space + spelling.envelope
    assert detector.invoke_tag_name == spelling.space + INVOKE
    assert detector.parameter_tag_name == spelling.space + PARAMETER


@pytest.mark.parametrize("fmt", list(DsmlFormat))
def test_the_encoder_writes_exactly_the_tokens_and_separators_of_the_table(fmt):
    s = fmt.spelling
    calls = [("f", {"a": "x y", "n": [1, {"k": None}]}), ("g", {"b": True})]
    tools = [{"type": "function", "function": {"name": n, "parameters": {}}} for n, _ in calls]

    def param(name: str, string: bool, value: str) -> str:
        kind = "true" if string else "false"
        return f'{s.tag(PARAMETER)} name="{name}" string="{kind}">{value}{s.closing(PARAMETER)}'

    invokes = [
        f'{s.tag(INVOKE)} name="f">{SEPARATOR}{param("a", True, "x y")}{SEPARATOR}'
        f"{param('n', False, '[1, {' + chr(34) + 'k' + chr(34) + ': null}]')}{SEPARATOR}"
        f"{s.closing(INVOKE)}",
        f'{s.tag(INVOKE)} name="g">{SEPARATOR}{param("b", False, "true")}{SEPARATOR}'
        f"{s.closing(INVOKE)}",
    ]
    block = SEPARATOR.join([s.block_open, *invokes, s.closing(s.envelope)])
    assert render(fmt, tools, calls, "Hi.") == f"Hi.{BLOCK_PREFIX}{block}{EOS}"


@pytest.mark.parametrize("fmt", list(DsmlFormat))
def test_an_invoke_without_parameters_holds_one_of_the_tables_bodies(fmt):
    s = fmt.spelling
    text = render(
        fmt, [{"type": "function", "function": {"name": "p", "parameters": {}}}], [("p", {})]
    )
    body = text.split(f'{s.tag(INVOKE)} name="p">', 1)[1].split(s.closing(INVOKE), 1)[0]
    assert body in EMPTY_INVOKE_BODIES


def _corpus(fmt: DsmlFormat) -> dict[str, dict]:
    path = Path(__file__).parents[2] / "data" / "dsml_corpus" / f"corpus_{fmt}.jsonl"
    return {row["edit"]: row for row in map(json.loads, path.read_text().splitlines())}


def test_deepseeks_reference_parser_demands_the_layout_the_validator_demands():
    """V3.2's reference parser (DeepSeek's, as SGLang ships it) reads the valid calls and
    refuses a lost newline, a lost blank line and text after the block."""
    from sglang.srt.entrypoints.openai import encoding_dsv32 as ds32

    rows = _corpus(DsmlFormat.V32)
    for edit in ("weather", "multi", "multilingual", "limits"):
        message = ds32.parse_message_from_completion_text(rows[edit]["text"], "chat")
        assert message["tool_calls"], edit
    for edit in ("no_newline_between_tags", "no_blank_line_before_block", "runaway_after_block"):
        with pytest.raises(ds32.DS32EncodingError):
            ds32.parse_message_from_completion_text(rows[edit]["text"], "chat")


@pytest.mark.parametrize("fmt", [DsmlFormat.V4, DsmlFormat.V41])
def test_deepseek_recipe_reads_no_arguments_from_a_json_body(fmt):
    row = _corpus(fmt)["json_body"]
    assert recipe_serve(row["text"], fmt, row["tools"]).calls == (("get_weather", {}),)
