"""The validator on the shapes production answers show without an echo (issue 58): loops of
long periods in the prose, the values and the reasoning, cycles of invokes, runs of U+FFFD
and chat-template tokens in the reasoning, and calls in another model family's dialect —
and the shapes that must stay VALID beside them: long repetitive values (CSV, logs,
tables), parallel calls to one tool with different arguments, multilingual text.  Each
threshold of `degenerate`'s docstring has its boundary tested here."""

from __future__ import annotations

import json
import random
import statistics
import time

import pytest

from dsv4_engine.probe.context import RequestContext
from dsv4_engine.probe.degenerate import _is_loop, _loop
from dsv4_engine.probe.dsml import EOS, DsmlFormat
from dsv4_engine.probe.outcome import Outcome
from dsv4_engine.probe.validate import classify_chat_message, classify_completion
from tests.unit.probe.encoders import WEATHER_TOOLS as TOOLS
from tests.unit.probe.encoders import render
from tests.unit.probe.producers import DIALECTS, validators

FMT = DsmlFormat.V4
PROMPT = "What is the weather in Lima?"
LIMA = [("get_weather", {"city": "Lima", "days": 2})]


def _judge(text: str, prompt: str | None = PROMPT) -> Outcome:
    """A raw completion judged as the engine judges it: no echo, the request known."""
    context = RequestContext.of(prompt, TOOLS)
    return classify_completion(text, FMT, validators(TOOLS), None, context).outcome


def _chat(message: dict, prompt: str | None = PROMPT) -> Outcome:
    context = RequestContext.of(prompt, TOOLS)
    return classify_chat_message(message, "stop", FMT, validators(TOOLS), None, context).outcome


def _sentence(size: int) -> str:
    """`size` characters of words that do not repeat inside themselves."""
    rng = random.Random(size)
    words = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 8)))
        for _ in range(size)
    ]
    return " ".join(words)[: size - 2] + ". "


def _with_prose(prose: str, reasoning: str | None = None) -> str:
    return render(FMT, TOOLS, LIMA, prose, reasoning)


@pytest.mark.parametrize(
    ("period", "repeats", "loop"),
    [
        (40, 4, False),  # 120 characters copied, under 5 repeats: a quote said again
        (40, 5, True),
        (70, 3, False),
        (70, 4, True),  # 210 characters copied
        (100, 2, False),  # a long sentence said twice is a stutter
        (100, 3, True),
        (250, 3, True),
        (400, 3, True),
        (401, 6, False),  # past the longest period searched
    ],
)
def test_the_repeats_a_loop_needs_fall_as_its_unit_grows(period, repeats, loop):
    unit = _sentence(period)
    assert len(unit) == period
    for place in ("prose", "reasoning"):
        text = (
            _with_prose("Checking. " + unit * repeats + "Done.")
            if place == "prose"
            else _with_prose("Checking.", "Plan: " + unit * repeats + "call it.")
        )
        expected = Outcome.DEGENERATE_TEXT if loop else Outcome.VALID
        assert _judge(text) is expected, (place, period, repeats)


def test_a_long_loop_in_a_value_counts_only_when_the_prompt_is_known():
    looped = [("get_weather", {"city": "Lima " + _sentence(150) * 3, "days": 2})]
    text = render(FMT, TOOLS, looped, "Checking.")
    assert _judge(text) is Outcome.DEGENERATE_TEXT
    assert _judge(text, prompt=None) is Outcome.VALID  # without it: maybe the user's data
    assert _judge(text, prompt="Use this city: " + looped[0][1]["city"]) is Outcome.VALID


def test_short_units_still_need_twelve_repeats_over_sixty_characters():
    assert _is_loop("ab", 30) and not _is_loop("ab", 29)
    assert _is_loop("ab ", 20) and not _is_loop("ab ", 19)
    assert _is_loop("abcde", 12) and not _is_loop("abcde", 11)


def _brute_force_loop(text: str) -> bool:
    """Whether any stretch repeating a unit of up to 400 characters passes the thresholds:
    every period, every position (quadratic, for short texts only)."""
    for shift in range(1, 401):
        run = 0
        for j in range(shift, len(text) + 1):
            if j < len(text) and text[j] == text[j - shift]:
                run += 1
                continue
            if run:
                unit = text[j - run - shift : j - run]
                period = (unit + unit).find(unit, 1)
                if _is_loop(unit[:period], (run + shift) // period):
                    return True
            run = 0
    return False


@pytest.mark.parametrize("seed", range(40))
def test_the_loop_search_finds_what_a_search_of_every_period_finds(seed):
    """The probes skip most of the text and take the nearest recurrence of each as its
    period; they must miss no loop an exhaustive search finds, also where the unit holds a
    part of itself twice (a shorter distance first)."""
    rng = random.Random(seed)
    alphabet = "abcdefgh"[: rng.randint(2, 8)]

    def word(low: int, high: int) -> str:
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(low, high)))

    pieces = []
    for _ in range(rng.randint(1, 4)):
        pieces.append(word(0, 80))
        part = word(20, 60)
        unit = word(1, 160) if seed % 2 else part + part[: rng.randint(0, 60)] + word(0, 9) + part
        pieces.append(unit * rng.randint(1, 8) + unit[: rng.randint(0, len(unit))])
    text = "".join(pieces)
    assert (_loop(text, None, True) is not None) is _brute_force_loop(text), text


def test_a_32k_character_answer_is_judged_in_milliseconds():
    """The engine judges every production tool-call answer: the loop search is near-linear
    (a regex over every period up to 400 took hundreds of milliseconds here)."""
    rng = random.Random(0)
    rows = "".join(f"2025-03-{d % 28 + 1:02d},{d},{rng.randint(0, 9999)}\n" for d in range(2000))
    log = "".join(
        f"10:{d // 60 % 60:02d}:{d % 60:02d} INFO replica {d % 3} ok\n" for d in range(1200)
    )
    prose = " ".join(_sentence(rng.randint(20, 200)) for _ in range(400))
    for body in (prose, "Rows:\n" + rows, "Log:\n" + log):
        text = _with_prose(body[:32_000])
        assert len(text) > 32_000
        times = []
        for _ in range(5):
            start = time.perf_counter()
            assert _judge(text) is Outcome.VALID
            times.append(time.perf_counter() - start)
        assert statistics.median(times) < 0.05


def _weather(city: str, days: int = 2) -> tuple[str, dict]:
    return ("get_weather", {"city": city, "days": days})


@pytest.mark.parametrize(
    ("calls", "outcome"),
    [
        ([_weather("Lima")] * 3, Outcome.DEGENERATE_TEXT),
        ([_weather("Lima"), _weather("Oslo")] * 2, Outcome.DEGENERATE_TEXT),
        ([_weather("Rome"), *[_weather("Lima"), _weather("Oslo")] * 3], Outcome.DEGENERATE_TEXT),
        ([_weather("Lima")] * 2, Outcome.VALID),  # a pair may be meant; the echo judges it
        ([_weather("Lima"), _weather("Oslo"), _weather("Lima")], Outcome.VALID),
        ([_weather(c) for c in ("Lima", "Oslo", "Rome", "Pune", "Kyiv", "Baku")], Outcome.VALID),
        ([_weather("Lima", d) for d in range(1, 8)], Outcome.VALID),
        ([("get_weather", {})] * 4, Outcome.VALID),  # no arguments: only one way to call
    ],
    ids=["one x3", "two x2", "after a call", "pair", "not back to back", "batch", "days", "none"],
)
def test_a_cycle_of_identical_calls_is_degenerate_a_batch_is_not(calls, outcome):
    prompt = "Weather for Lima, Oslo, Rome, Pune, Kyiv and Baku, each day of the week"
    assert _judge(render(FMT, TOOLS, calls, "Checking."), prompt) is outcome
    served = [
        {"type": "function", "function": {"name": n, "arguments": json.dumps(a)}} for n, a in calls
    ]
    assert _chat({"content": "Checking.", "tool_calls": served}, prompt) is outcome


def test_replacement_characters_and_template_tokens_in_the_reasoning_are_degenerate():
    for damage in ("\ufffd", "\ufffd\ufffd\ufffd", "<｜User｜>", "<｜Assistant｜>", "<think>", EOS):
        reasoning = f"The user wants Lima{damage} weather."
        completion = f"{reasoning}</think>{_with_prose('Checking.')}"
        assert _judge(completion) is Outcome.DEGENERATE_TEXT, damage
        served = {"content": "", "reasoning_content": reasoning, "tool_calls": _served(LIMA)}
        assert _chat(served) is Outcome.DEGENERATE_TEXT, damage
        unparsed = {"content": _with_prose("Checking."), "reasoning_content": reasoning}
        assert _chat(unparsed) is Outcome.DEGENERATE_TEXT, damage


def test_mixed_script_words_count_in_the_prose_not_in_the_reasoning():
    """The reasoning is a scratchpad of notation and quotes: script evidence is not judged
    there (loops, U+FFFD and template tokens are)."""
    salad = "Lеt me chеck the wеather."  # Cyrillic е glued into Latin words
    assert _judge(_with_prose(salad)) is Outcome.DEGENERATE_TEXT
    assert _judge(f"{salad}</think>{_with_prose('Checking.')}") is Outcome.VALID


def test_a_closed_json_array_in_the_prose_or_reasoning_is_data_an_open_one_a_loop():
    board = json.dumps({"cells": [[0] * 10 for _ in range(10)]})
    plan = f"The board starts empty: {board}. Now call it."
    assert _judge(f"{plan}</think>{_with_prose('Checking.')}") is Outcome.VALID
    assert _judge(_with_prose(plan)) is Outcome.VALID
    assert _judge(f"Checking. {board[:-20]}{EOS}") is Outcome.DEGENERATE_TEXT  # never closed


def test_a_think_token_that_opens_the_completion_opens_the_reasoning():
    answer = _with_prose("Checking.")
    assert _judge(f"<think>Plan: call it.</think>{answer}") is Outcome.VALID
    assert _judge(f"<think>Plan: <think>call it.</think>{answer}") is Outcome.DEGENERATE_TEXT


def test_a_loop_in_the_reasoning_content_of_a_served_message_is_degenerate():
    reasoning = "I should call get_weather for Lima now. " * 6
    served = {"content": "Checking.", "reasoning_content": reasoning, "tool_calls": _served(LIMA)}
    assert _chat(served) is Outcome.DEGENERATE_TEXT
    assert _chat(dict(served, reasoning_content="I should call get_weather.")) is Outcome.VALID


def test_without_a_reasoning_parser_the_reasoning_in_the_content_is_judged_as_reasoning():
    for calls in (_served(LIMA), []):
        content = "Plan: call it.</think>Checking."
        if not calls:
            content = "Plan: call it.</think>" + _with_prose("Checking.")
        assert _chat({"content": content, "tool_calls": calls}) is Outcome.VALID
        looped = content.replace("Plan: ", "Plan: " + "I should call get_weather now. " * 6)
        assert _chat({"content": looped, "tool_calls": calls}) is Outcome.DEGENERATE_TEXT


def _served(calls: list[tuple[str, dict]]) -> list[dict]:
    return [
        {"type": "function", "function": {"name": n, "arguments": json.dumps(a)}} for n, a in calls
    ]


def test_a_run_of_replacement_characters_in_a_value_needs_a_known_prompt_that_lacks_it():
    text = render(FMT, TOOLS, [_weather("Li\ufffd\ufffd\ufffdma")], "Checking.")
    assert _judge(text) is Outcome.DEGENERATE_TEXT
    assert _judge(text, prompt=None) is Outcome.VALID  # a pasted binary file is such runs
    assert _judge(text, prompt="Weather in Li\ufffd\ufffd\ufffdma?") is Outcome.VALID


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: getattr(d, "__name__", "ascii"))
def test_a_call_in_another_dialect_is_leaked_markup_unless_the_request_holds_it(dialect):
    markup = dialect(*LIMA[0])
    in_content = f"Checking.\n\n{markup}{EOS}"
    assert _judge(in_content) is Outcome.LEAKED_MARKUP
    assert _chat({"content": in_content}) is Outcome.LEAKED_MARKUP
    assert _chat({"content": markup, "tool_calls": _served(LIMA)}) is Outcome.LEAKED_MARKUP
    assert _judge(_with_prose("Checking.", "Maybe: " + markup)) is Outcome.LEAKED_MARKUP
    assert _judge(in_content, prompt=f"What does {markup} do?") is not Outcome.LEAKED_MARKUP
    in_value = render(FMT, TOOLS, [_weather(markup)], "Checking.")
    assert _judge(in_value, prompt=f"Weather for {markup}") is Outcome.VALID  # data


def test_dsml_element_names_without_the_marker_stay_a_near_miss():
    anthropic = (
        '<function_calls>\n<invoke name="get_weather">\n<parameter name="city">Lima'
        "</parameter>\n</invoke>\n</function_calls>"
    )
    assert _judge(f"Checking.\n\n{anthropic}{EOS}") is Outcome.ENVELOPE_MISMATCH


def test_prose_that_names_a_dialect_s_tags_is_no_call():
    prose = "Hermes wraps a call in a <tool_call> tag; Llama writes <function=NAME> before JSON."
    assert _judge(_with_prose(prose)) is Outcome.VALID


CSV = "date,requests\n" + "\n".join(f"2025-03-{d:02d},{1000 + 13 * d}" for d in range(1, 32))
LOG = "\n".join(f"10:00:{s:02d} INFO replica {s % 3} health check ok" for s in range(60))
EMPTY_TABLE = "| a | b | c |\n| --- | --- | --- |\n" + "|     |     |     |\n" * 12
ASCII_TABLE = "\n".join(
    ["+----+----+", *(f"| {i:<2} | {i * i:<2} |\n+----+----+" for i in range(9))]
)


@pytest.mark.parametrize(
    "value", [CSV, LOG, EMPTY_TABLE, ASCII_TABLE], ids=["csv", "log", "empty", "ascii"]
)
def test_long_repetitive_values_are_no_loop(value):
    text = render(FMT, TOOLS, [_weather(value)], "Saving.")
    assert _judge(text, "Weather, then save the data as a file.") is Outcome.VALID


def test_rows_of_a_character_that_is_no_rule_are_still_a_loop():
    text = render(FMT, TOOLS, [_weather("|!!!!|!!!!|\n" * 12)], "Saving.")
    assert _judge(text) is Outcome.DEGENERATE_TEXT


MULTILINGUAL = (
    "中文: 你好, 欢迎使用。日本語: こんにちは、ようこそ。한국어: 안녕하세요. "
    "русский: Привет, добро пожаловать. العربية: مرحبا، أهلا وسهلا. עברית: שלום. "
)


def test_long_multilingual_prose_and_reasoning_are_valid():
    prompt = "Greet the team: " + MULTILINGUAL
    text = _with_prose(MULTILINGUAL * 2 + "Done.", "先看城市。" + MULTILINGUAL)
    assert _judge(text, prompt) is Outcome.VALID
