"""Edge cases of the judge beyond the corpus: ordinary text that must stay VALID, and
OpenAI messages with server-parsed tool calls."""

import json
import random

import pytest

from dsv4_engine.probe.dsml import EOS, DsmlFormat
from dsv4_engine.probe.outcome import Outcome
from dsv4_engine.probe.tools import Echo, tool_validators
from dsv4_engine.probe.validate import classify_chat_message, classify_completion
from dsv4_engine.probe.workload import ECHO_TOOL, random_echo

ORDINARY = [
    "```python\nfor i in range(10):\n    print(i)\n```\nThis prints 0 to 9.",
    '{"name": "Ada", "langs": ["en", "fr"], "age": 36}',
    "1. Install.\n2. Configure.\n3. Run.\n\n---\n\nDone.",
    "日本語の文章です。GPUメモリは80GBです。한국어 문장도 있습니다.",
    "Привет! Это обычный русский текст, а это English words in the same answer.",
    "Ha ha ha, that is funny.",
    "=" * 40 + "\nTitle\n" + "=" * 40,
]


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_text_is_valid(text):
    assert classify_completion(text + EOS, DsmlFormat.V4).outcome is Outcome.VALID


ECHO = random_echo(random.Random(1))
VALIDATORS = tool_validators([ECHO_TOOL])


def _call(args: dict | str, name: str = ECHO.tool) -> dict:
    arguments = args if isinstance(args, str) else json.dumps(args)
    return {"id": "c0", "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.mark.parametrize(
    ("message", "finish", "outcome"),
    [
        ({"content": None, "tool_calls": [_call(ECHO.args)]}, "tool_calls", Outcome.VALID),
        (
            {"content": "", "tool_calls": [_call(dict(ECHO.args, count=7))]},
            "stop",
            Outcome.ARG_CORRUPTION,
        ),
        (
            {"content": "", "tool_calls": [_call(dict(ECHO.args, count="7"))]},
            "stop",
            Outcome.SCHEMA,
        ),
        ({"content": "", "tool_calls": [_call('{"record_id": ')]}, "stop", Outcome.SCHEMA),
        ({"content": "", "tool_calls": [_call(ECHO.args, "record_ech")]}, "stop", Outcome.SCHEMA),
        (
            {"content": "ok </｜DSML｜invoke>", "tool_calls": [_call(ECHO.args)]},
            "stop",
            Outcome.LEAKED_MARKUP,
        ),
        ({"content": "I will now call the tool and"}, "length", Outcome.TRUNCATED),
        ({"content": "I will call " + "the tool " * 30}, "length", Outcome.DEGENERATE_TEXT),
        ({"content": "Stored."}, "stop", Outcome.SCHEMA),
    ],
)
def test_chat_message_with_server_parsed_calls(message, finish, outcome):
    judged = classify_chat_message(message, finish, DsmlFormat.V4, VALIDATORS, ECHO)
    assert judged.outcome is outcome, judged.detail


def test_echo_fast_path_does_not_skip_the_schema_for_untrusted_echo_requests():
    """An echo request read from a user's file is not known to fit the schema."""
    bad = Echo(ECHO.tool, dict(ECHO.args, record_id="nope"))
    message = {"content": "", "tool_calls": [_call(bad.args)]}
    judged = classify_chat_message(message, "stop", DsmlFormat.V4, VALIDATORS, bad)
    assert judged.outcome is Outcome.SCHEMA
