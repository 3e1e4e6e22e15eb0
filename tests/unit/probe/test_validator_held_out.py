"""What the held-out producers (producers.py, scored by `make bench-validator`) found wrong
with the validator, one test per fix, and a sample of those producers as a quick property.

Found: a batch of calls to one tool read as a loop (the tags between its values repeat);
drawn lines read as loops (a ten-column markdown table's ``| --- |`` row, an 80-column
``====`` underline, an ASCII table's ``+-----+`` border); U+FFFD — bytes that
form no character — accepted as language; and a tag whose marker was misspelt or lost
inside the block classed by what broke after it (UNBALANCED, TRUNCATED) instead of
ENVELOPE_MISMATCH; a stream cut right after the block's first ``<`` read as prose; and a
JSON value of repeated elements (a board of zeros) read as a loop.
"""

from itertools import product

import pytest

from dsv4_engine.probe.context import RequestContext
from dsv4_engine.probe.dsml import EOS, MARKER, DsmlFormat
from dsv4_engine.probe.outcome import Outcome
from dsv4_engine.probe.validate import classify_completion
from tests.unit.probe.encoders import WEATHER_TOOLS as TOOLS
from tests.unit.probe.encoders import render
from tests.unit.probe.producers import held_out, validators

RECIPE_FORMATS = (DsmlFormat.V4, DsmlFormat.V41)
"""deepseek-recipe renders these without importing SGLang (seconds): the quick tests' own."""
CITIES = ("Paris", "東京", "Москва", "القاهرة", "Αθήνα", "서울", "Zürich", "Kraków", "Lima")
QUICK_PRODUCERS = (
    "encoder",
    "loop",
    "salad",
    "garbled",
    "runaway",
    "special",
    "cycle",
    "dialect",
)
"""All but those that call SGLang (its served messages, the mutations' served-parser check)."""
TEST_SEED = -1
"""The bench draws its held-out seed from 0 .. 2**32 - 1: never this one."""


def _judge(text: str, fmt: DsmlFormat, prompt: str | None = None) -> Outcome:
    context = RequestContext.of(prompt, TOOLS)
    return classify_completion(text, fmt, validators(TOOLS), None, context).outcome


@pytest.mark.parametrize(("producer", "fmt"), list(product(QUICK_PRODUCERS, RECIPE_FORMATS)))
def test_a_sample_of_the_held_out_producers_is_judged_as_they_made_it(producer, fmt):
    for index in range(25):
        case = held_out(producer, fmt, TEST_SEED, index)
        judged = case.judge()
        assert case.agrees(judged.outcome), (index, judged.detail, case.text)


@pytest.mark.parametrize("fmt", RECIPE_FORMATS)
def test_a_batch_of_calls_to_one_tool_is_no_loop(fmt):
    calls = [("get_weather", {"city": city, "days": 3}) for city in CITIES]
    text = render(fmt, TOOLS, calls, "Checking each city.")
    assert _judge(text, fmt, "Weather for: " + ", ".join(CITIES)) is Outcome.VALID
    assert _judge(text, fmt) is Outcome.VALID


DRAWN_LINES = {
    "a markdown table's delimiter row": "|" + " --- |" * 12,
    "an aligned delimiter row": "|" + " :---: |" * 12,
    "a title's underline": "=" * 80,
    "an ASCII table's border": "+" + "-----+" * 12,
    "a code comment's banner": "# " + "-" * 77,
    "a box-drawing rule": "─" * 100,
}


@pytest.mark.parametrize("line", DRAWN_LINES.values(), ids=list(DRAWN_LINES))
def test_a_drawn_line_is_no_loop_but_the_same_run_in_a_sentence_past_a_line_or_cut_is(line):
    prose = f"Plan:\n\n| a | b |\n{line}\n| x | y |"
    text = render(DsmlFormat.V4, TOOLS, [("get_weather", {"city": "Lima"})], prose)
    assert _judge(text, DsmlFormat.V4) is Outcome.VALID
    for looping in (f"And then {line} and on.", line * 4, f"Plan:\n\n| a | b |\n{line}"):
        outcome = classify_completion(looping + EOS, DsmlFormat.V4).outcome
        assert outcome is Outcome.DEGENERATE_TEXT, looping


def test_a_run_of_exclamation_marks_is_no_drawn_line():
    """The classic output of a decoder reading NaNs: token 0, ``!``, over and over."""
    assert classify_completion("!" * 80 + EOS, DsmlFormat.V4).outcome is Outcome.DEGENERATE_TEXT


def test_bytes_that_form_no_character_are_degenerate_unless_the_request_holds_them():
    call = ("get_weather", {"city": "Par\ufffds"})
    garbled_prose = render(DsmlFormat.V4, TOOLS, [("get_weather", {"city": "Lima"})], "Let\ufffd")
    assert _judge(garbled_prose, DsmlFormat.V4) is Outcome.DEGENERATE_TEXT
    assert _judge(garbled_prose, DsmlFormat.V4, "say Let\ufffd") is Outcome.VALID
    garbled_value = render(DsmlFormat.V4, TOOLS, [call], "Checking.")
    assert _judge(garbled_value, DsmlFormat.V4, "weather in Paris") is Outcome.DEGENERATE_TEXT
    assert _judge(garbled_value, DsmlFormat.V4, "weather in Par\ufffds") is Outcome.VALID
    assert _judge(garbled_value, DsmlFormat.V4) is Outcome.VALID  # a value is user data


def _misspelt(fmt: DsmlFormat, closing: str, respelling: str) -> str:
    """A valid completion with the marker of one closing tag respelled (the last one)."""
    text = render(fmt, TOOLS, [("get_weather", {"city": "Lima", "days": 2})], "Ok.")
    tag = f"</{MARKER}{fmt.spelling.space}{closing}>"
    at = text.rindex(tag)
    return text[:at] + tag.replace(MARKER, respelling) + text[at + len(tag) :]


@pytest.mark.parametrize(
    ("closing", "respelling", "was"),
    [
        ("parameter", "｜dsml｜", Outcome.UNBALANCED),
        ("invoke", "", Outcome.UNBALANCED),
        ("tool_calls", "DSML｜", Outcome.TRUNCATED),
        ("tool_calls", "", Outcome.TRUNCATED),
    ],
)
def test_a_misspelt_closing_tag_inside_the_block_is_an_envelope_mismatch(closing, respelling, was):
    outcome = _judge(_misspelt(DsmlFormat.V4, closing, respelling), DsmlFormat.V4)
    assert outcome is Outcome.ENVELOPE_MISMATCH, f"was {was}"


def test_a_value_cut_off_while_quoting_xml_is_still_truncated():
    text = render(DsmlFormat.V4, TOOLS, [("get_weather", {"city": "<invoke> and <calls>"})], "")
    assert _judge(text[: text.index("<calls>") + 9], DsmlFormat.V4) is Outcome.TRUNCATED


def test_a_stream_cut_after_the_first_byte_of_the_block_is_truncated():
    text = render(DsmlFormat.V41, TOOLS, [("get_weather", {"city": "Lima"})], "Ok.")
    cut = text[: text.index("<" + MARKER) + 1]
    assert cut.endswith("\n\n<")
    assert _judge(cut, DsmlFormat.V41) is Outcome.TRUNCATED  # was SCHEMA: no tool call
    assert _judge("Is 2 < 3? Yes: 2 <" + EOS, DsmlFormat.V41) is Outcome.VALID


def test_repeated_elements_of_a_json_value_are_data_not_a_loop():
    tools = [{"type": "function", "function": {"name": "init", "parameters": {"type": "object"}}}]
    context = RequestContext.of("Create an empty 10x10 board and 24 hourly counters", tools)

    def judge(value: object) -> Outcome:
        text = render(DsmlFormat.V4, tools, [("init", {"cells": value})], "Done.")
        return classify_completion(text, DsmlFormat.V4, validators(tools), None, context).outcome

    for cells in ([[0] * 10 for _ in range(10)], [0] * 24, [{"n": 0}] * 12):
        assert judge(cells) is Outcome.VALID, cells
    assert judge("0, " * 24) is Outcome.DEGENERATE_TEXT  # a string: language, and it loops
