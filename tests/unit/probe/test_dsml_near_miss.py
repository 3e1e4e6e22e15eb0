"""The two errors issue 16 reports, both ways: envelopes that only look like DSML are refused
with the deviation named (and SGLang indeed serves no call from them), and legitimate
multilingual values are accepted in every format and on both judging paths."""

import json

import pytest

from dsv4_engine.probe.context import RequestContext
from dsv4_engine.probe.dsml import EOS, MARKER, DsmlFormat
from dsv4_engine.probe.outcome import Outcome
from dsv4_engine.probe.tools import Echo, tool_validators
from dsv4_engine.probe.validate import classify_chat_message, classify_completion
from tests.unit.probe.encoders import WEATHER_TOOLS as TOOLS
from tests.unit.probe.encoders import render
from tests.unit.probe.served_parsers import sglang_serve

pytestmark = pytest.mark.sglang

CALL = ("get_weather", {"city": "San Francisco", "days": 3})
FORMATS = list(DsmlFormat)


def _valid(fmt: DsmlFormat) -> str:
    return render(fmt, TOOLS, [CALL], "Let me check.")


def _other_space(fmt: DsmlFormat) -> str:
    return "" if fmt.spelling.space else " "


# name -> (rewrite of a valid completion, words the detail must contain)
NEAR_MISSES = {
    "ASCII bars": (lambda t, f: t.replace(MARKER, "|DSML|"), "U+007C"),
    "fullwidth bar on one side only": (lambda t, f: t.replace(MARKER, "|DSML｜"), "U+007C"),
    "lower-case marker": (lambda t, f: t.replace(MARKER, "｜dsml｜"), "'dsml'"),
    "marker missing (plain XML)": (
        lambda t, f: t.replace(MARKER + f.spelling.space, ""),
        "plain XML",
    ),
    "spacing of the other formats": (
        lambda t, f: t.replace(MARKER + f.spelling.space, MARKER + _other_space(f)),
        "between the marker",
    ),
    "envelope of another format": (
        lambda t, f: t.replace(
            f"{f.spelling.space}{f.envelope}>", f"{f.spelling.space}xcalls>"
        ).replace("xcalls", "function_calls" if f is not DsmlFormat.V32 else "tool_calls"),
        "envelope",
    ),
    "element name case": (
        lambda t, f: t.replace(
            f"{MARKER}{f.spelling.space}invoke", f"{MARKER}{f.spelling.space}INVOKE"
        ),
        "'INVOKE'",
    ),
}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", list(NEAR_MISSES))
def test_a_near_miss_envelope_is_refused_with_the_deviation_named(fmt, name):
    rewrite, named = NEAR_MISSES[name]
    text = rewrite(_valid(fmt), fmt)
    judged = classify_completion(text, fmt, tool_validators(TOOLS))
    assert judged.outcome is Outcome.ENVELOPE_MISMATCH, judged
    assert named in judged.detail, judged.detail


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", ["ASCII bars", "lower-case marker", "marker missing (plain XML)"])
def test_sglang_serves_no_call_from_a_near_miss(fmt, name):
    """Why refusing them is right: the served parser does not see a tool call there."""
    text = NEAR_MISSES[name][0](_valid(fmt), fmt)
    assert sglang_serve(_valid(fmt), fmt, TOOLS).calls == (CALL,)
    assert sglang_serve(text, fmt, TOOLS).calls == ()


@pytest.mark.parametrize("fmt", FORMATS)
def test_near_miss_markup_in_reasoning_or_next_to_parsed_calls_is_leaked(fmt):
    ascii_invoke = '<|DSML|invoke name="get_weather">'
    text = render(fmt, TOOLS, [CALL], reasoning=f"I will write {ascii_invoke}.")
    assert classify_completion(text, fmt).outcome is Outcome.LEAKED_MARKUP
    call = {"type": "function", "function": {"name": CALL[0], "arguments": json.dumps(CALL[1])}}
    for message in (
        {"content": f"Sure. {ascii_invoke}", "tool_calls": [call]},
        {"content": "", "reasoning_content": ascii_invoke, "tool_calls": [call]},
    ):
        assert classify_chat_message(message, "tool_calls", fmt).outcome is Outcome.LEAKED_MARKUP


@pytest.mark.parametrize(
    "prose",
    [
        "Use <parameter> elements in the Ant build file.",
        "The <calls> table lists every call; see the DSML (DeepSeek Markup Language) notes.",
    ],
)
def test_xml_words_in_ordinary_prose_are_not_near_misses(prose):
    assert classify_completion(prose + EOS, DsmlFormat.V4).valid


MULTILINGUAL = {
    "arabic": "مرحبا بالعالم",
    "cyrillic": "Здравствуй, мир",
    "cjk": "你好，世界 こんにちは 안녕하세요",
    "hebrew": "שלום עולם",
    "greek": "Καλημέρα κόσμε",
    "latin": "Hello, café naïve",
    "emoji": "👋🌍🎉 👨‍👩‍👧‍👦",
    "all_in_one": "مرحبا Привет 你好 שלום Γειά Hello 👋 — Lеt's mix: ΔΔCt, Tシャツ, weatherпогода",
    "list": ["العربية", "Русский", "中文", "עברית", "Ελληνικά", "English", "🏳️‍🌈"],
}
NOTE_TOOLS = [{"type": "function", "function": {"name": "store", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("with_request", [False, True], ids=["no request", "prompt and echo"])
def test_multilingual_values_in_one_call_are_valid(fmt, with_request):
    text = render(fmt, NOTE_TOOLS, [("store", MULTILINGUAL)], "Saving it 👍")
    echo = Echo("store", MULTILINGUAL) if with_request else None
    context = (
        RequestContext.of(f"Store {json.dumps(MULTILINGUAL)}", NOTE_TOOLS, echo)
        if with_request
        else None
    )
    judged = classify_completion(text, fmt, tool_validators(NOTE_TOOLS), echo, context)
    assert judged.valid, judged.detail
    call = {
        "type": "function",
        "function": {"name": "store", "arguments": json.dumps(MULTILINGUAL)},
    }
    message = {"content": None, "tool_calls": [call]}
    assert classify_chat_message(message, "tool_calls", fmt, None, echo, context).valid


def test_a_multilingual_prose_answer_without_a_prompt_is_valid():
    prose = "Hello: مرحبا (Arabic), Привет (Russian), שלום (Hebrew), Γειά σου (Greek), 你好 👋"
    assert classify_completion(prose + EOS, DsmlFormat.V4).valid


def test_salad_is_still_caught_from_its_own_evidence():
    salad = "Lеt me chеck the wеather пожалуйста now." + EOS
    assert classify_completion(salad, DsmlFormat.V4).outcome is Outcome.DEGENERATE_TEXT
    foreign = "Let me check the καιρός weather طقس now." + EOS
    english = RequestContext.of("What is the weather in Paris?")
    judged = classify_completion(foreign, DsmlFormat.V4, context=english)
    assert judged.outcome is Outcome.DEGENERATE_TEXT and "ARABIC, GREEK" in judged.detail
    assert classify_completion(foreign, DsmlFormat.V4).valid  # no prompt: could be quoting it
