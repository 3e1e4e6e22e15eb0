"""The live judge: each served answer's outcome, counted off the response path through a
bounded queue (a full one counts `skipped`), nothing of an answer kept unless asked, and
then redacted and bounded."""

from __future__ import annotations

import json
import threading

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dsv4_engine import live_judge
from dsv4_engine.live_judge import Answer, LiveJudge, StreamedMessage, judge, redact
from dsv4_engine.probe.dsml_format import DsmlFormat, render_dsml
from tests.unit.engine.weather_request import MESSAGES, TOOLS

V4 = DsmlFormat.V4
BLOCK = render_dsml(V4, "get_weather", {"city": "Paris"})


def call(**args) -> dict:
    function = {"name": "get_weather", "arguments": json.dumps(args)}
    return {"id": "call_1", "type": "function", "function": function}


def answer(content="", finish="tool_calls", calls=(), reasoning=None, tokens=12) -> Answer:
    message = {"role": "assistant", "content": content, "tool_calls": list(calls) or None}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return Answer(message, finish, TOOLS, MESSAGES, tokens)


CASES = {
    "VALID": answer(calls=[call(city="Paris")]),
    "VALID prose": answer("It is sunny in Paris.", "stop"),
    "SCHEMA": answer(calls=[call(town="Paris")]),
    "LEAKED_MARKUP": answer("<｜DSML｜invoke", calls=[call(city="Paris")]),
    "LEAKED_MARKUP reasoning": answer(calls=[call(city="Paris")], reasoning="x" + BLOCK),
    "DEGENERATE_TEXT": answer("The weather is nice today. " * 30, "stop"),
    "DSML_IN_CONTENT": answer("Let me check." + BLOCK, "stop"),
    "TRUNCATED": answer("Let me check" + BLOCK[:40], "length"),
    "TRUNCATED prose": answer("Let me check the wea", "length"),
}


@pytest.mark.parametrize("case", CASES)
def test_each_outcome_of_a_served_answer(case):
    outcome, _ = judge(CASES[case], V4)
    assert outcome == case.split()[0]


def test_a_loop_cut_by_max_tokens_stays_a_loop():
    outcome, _ = judge(answer("The weather is nice today. " * 30, "length"), V4)
    assert outcome == "DEGENERATE_TEXT"


def test_every_outcome_is_counted_and_shown_from_zero():
    judged = LiveJudge(V4, revision="r1", role="decode")
    page = "\n".join(live_judge.render(judged)) + "\n"
    families = {f.name: f for f in text_string_to_metric_families(page)}
    counter = families[live_judge.METRIC.removesuffix("_total")]
    shown = {s.labels["outcome"]: s.value for s in counter.samples if s.name.endswith("_total")}
    assert shown == dict.fromkeys(live_judge.OUTCOMES, 0.0)
    for case in CASES.values():
        judged.submit(case)
    assert judged.drain()
    counts = judged.counts()
    assert {o: n for o, n in counts.items() if n} == {
        "VALID": 2, "SCHEMA": 1, "LEAKED_MARKUP": 2, "DEGENERATE_TEXT": 1,
        "DSML_IN_CONTENT": 1, "TRUNCATED": 2,
    }  # fmt: skip
    page = "\n".join(live_judge.render(judged)) + "\n"
    families = {f.name: f for f in text_string_to_metric_families(page)}
    histogram = families[live_judge.TOKENS_METRIC]
    (count,) = [s for s in histogram.samples if s.name.endswith("_count")]
    assert count.value == len(CASES) and count.labels == {"revision": "r1", "role": "decode"}
    judged.stop()


def test_a_full_queue_counts_skipped_at_once_never_drops_silently():
    release = threading.Event()

    def slow(_answer, _fmt):
        release.wait(10)
        return "VALID", ""

    judged = LiveJudge(V4, queue_size=2, judge_fn=slow)
    for _ in range(6):  # one in the worker's hands, two queued, three skipped
        judged.submit(CASES["VALID"])
    release.set()
    assert judged.drain()
    counts = judged.counts()
    assert counts["VALID"] + counts["skipped"] == 6 and counts["skipped"] >= 3
    assert judged.tally.tokens_count == counts["VALID"], "skipped answers have no length"
    judged.stop()


def test_a_judge_that_fails_counts_nothing_and_keeps_judging(caplog):
    calls = []

    def flaky(_answer, _fmt):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("Jane Doe's answer")
        return "VALID", ""

    judged = LiveJudge(V4, judge_fn=flaky)
    judged.submit(CASES["VALID"])
    judged.submit(CASES["VALID"])
    assert judged.drain()
    assert judged.counts()["VALID"] == 1
    assert "RuntimeError" in caplog.text and "Jane" not in caplog.text
    judged.stop()


def test_nothing_of_an_answer_is_kept_by_default(caplog):
    judged = LiveJudge(V4)
    judged.submit(CASES["DSML_IN_CONTENT"])
    assert judged.drain()
    assert judged.counts()["DSML_IN_CONTENT"] == 1
    assert judged.recent_examples() == [] and caplog.records == []
    judged.stop()


def test_opted_in_examples_are_bounded_and_redacted():
    judged = LiveJudge(V4, examples=2)
    secret = answer("Account 4711 of Jane Doe: " + "loop " * 40, "stop")
    for case in (CASES["SCHEMA"], CASES["VALID"], secret, CASES["DSML_IN_CONTENT"]):
        judged.submit(case)
    assert judged.drain()
    examples = judged.recent_examples()
    assert [e["outcome"] for e in examples] == ["DEGENERATE_TEXT", "DSML_IN_CONTENT"]
    dump = json.dumps(examples, ensure_ascii=False)
    for word in ("4711", "Jane", "Paris", "loop", "weather"):
        assert word not in dump
    assert examples[0]["content_shape"].startswith("xxxxxxx 0000 xx xxxx xxx: xxxx xxxx")
    assert len(examples[0]["content_shape"]) <= live_judge.EXAMPLE_CHARS + 1
    assert examples[1]["content_shape"].count("<｜DSML｜invoke") == 1, "markup stays visible"
    assert examples[0]["content_chars"] == len(secret.message["content"])
    judged.stop()


def test_redact_masks_every_script_and_keeps_markup():
    assert redact("Привет 123 世界 </think>") == "xxxxxx 000 xx </think>"
    assert redact("a" * 200, 10) == "x" * 10 + "…"


def test_streamed_deltas_join_to_the_message_the_client_sees():
    joined = StreamedMessage()
    for choice in (
        {"delta": {"role": "assistant", "content": ""}},
        {"delta": {"reasoning_content": "think"}},
        {"delta": {"content": "Sure"}},
        {"delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "get_weather",
                                                                        "arguments": ""}}]}},
        {"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}},
        {"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}},
        {"delta": {}, "finish_reason": "tool_calls"},
    ):  # fmt: skip
        joined.add_choice(choice)
    message = joined.message()
    assert message["content"] == "Sure" and message["reasoning_content"] == "think"
    (only,) = message["tool_calls"]
    assert only["id"] == "c1" and json.loads(only["function"]["arguments"]) == {"city": "Paris"}
    assert joined.finish_reason == "tool_calls"


@pytest.mark.parametrize(
    ("env", "on"),
    [({}, True), ({"DSV4_LIVE_JUDGE": "off"}, False), ({"DSV4_LIVE_JUDGE": "0"}, False)],
)
def test_the_switch(env, on):
    assert live_judge.enabled(env) is on


def test_the_parsers_formats_and_settings():
    assert live_judge.format_of_parser("deepseekv41") is DsmlFormat.V41
    assert live_judge.format_of_parser("qwen25") is None
    assert live_judge.revision({}) == "" and live_judge.revision({"DSV4_REVISION": "r3"}) == "r3"
    assert live_judge.offers_tools(TOOLS) and live_judge.offers_tools(TOOLS, "auto")
    assert not live_judge.offers_tools(TOOLS, "none"), "no tool rendered, no parser run"
    assert not live_judge.offers_tools([]) and not live_judge.offers_tools(None)
    assert live_judge.examples_kept({}) == 0
    assert live_judge.examples_kept({"DSV4_LIVE_JUDGE_EXAMPLES": "5000"}) == 100
    with pytest.raises(ValueError, match="DSV4_LIVE_JUDGE_EXAMPLES"):
        live_judge.examples_kept({"DSV4_LIVE_JUDGE_EXAMPLES": "many"})
