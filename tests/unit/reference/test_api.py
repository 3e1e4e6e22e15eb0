"""Prompt rendering (DeepSeek's recipe), the byte tokenizer and OpenAI bodies."""

from __future__ import annotations

import pytest

from dsv4_engine.probe.dsml import DsmlFormat
from dsv4_engine.probe.dsml_format import render_dsml
from dsv4_engine.reference import chat, openai_api, tokenizer

TOOL = {
    "type": "function",
    "function": {"name": "record", "parameters": {"type": "object", "properties": {}}},
}


def test_tokenizer_round_trips_text_and_specials():
    text, specials = chat.render({"messages": [{"role": "user", "content": "héllo <｜User｜>"}]})
    ids = tokenizer.encode(text, specials)
    assert ids[0] == tokenizer.BOS_ID
    assert tokenizer.decode(ids) == text
    # The user's literal "<｜User｜>" stays bytes; only the template's markers are specials.
    user_id = tokenizer.BYTE_TOKENS + tokenizer.SPECIAL_TOKENS.index("<｜User｜>")
    assert ids.count(user_id) == 1


def test_tools_and_tool_history_are_rendered_in_dsml():
    body = {
        "messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "record", "arguments": {"a": 1}}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "stored"},
        ],
        "tools": [TOOL],
    }  # fmt: skip
    text, _ = chat.render(body)
    assert '"name": "record"' in text
    assert '<｜DSML｜invoke name="record">' in text
    assert "<tool_result>stored</tool_result>" in text


def test_bad_messages_are_a_client_error():
    with pytest.raises(openai_api.BadRequest, match="messages"):
        openai_api.chat_prompt({"messages": []})
    with pytest.raises(openai_api.BadRequest, match="messages"):
        openai_api.chat_prompt({"messages": [{"role": "wizard", "content": "x"}]})
    with pytest.raises(openai_api.BadRequest, match="max_tokens"):
        openai_api.chat_prompt({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})


def test_dsml_output_becomes_tool_calls():
    text = "Sure." + render_dsml(DsmlFormat.V4, "record", {"id": "R-1", "n": 3})
    message = openai_api.chat_message(text, tools_requested=True)
    call = message["tool_calls"][0]["function"]
    assert call["name"] == "record" and call["arguments"] == '{"id": "R-1", "n": 3}'
    assert message["content"] == "Sure."


def test_malformed_dsml_stays_raw_text():
    text = render_dsml(DsmlFormat.V4, "record", {"id": "R-1"})[:-20]
    assert openai_api.chat_message(text, tools_requested=True) == {
        "role": "assistant",
        "content": text,
    }


def test_completion_prompt_accepts_text_or_ids():
    assert openai_api.completion_prompt({"prompt": "ab"}).ids == [97, 98]
    assert openai_api.completion_prompt({"prompt": [1, 2], "max_tokens": 3}).max_tokens == 3
    with pytest.raises(openai_api.BadRequest, match="prompt"):
        openai_api.completion_prompt({"prompt": [100000]})


def _streamed(pieces: list[str]) -> tuple[str, list[dict], bool]:
    """(content joined, tool calls joined as a client joins them, finish by tool_calls)."""
    stream = openai_api.ToolCallStream()
    deltas = [d for piece in pieces for d in stream.feed(piece)] + stream.end()
    content = "".join(d.get("content", "") for d in deltas)
    calls: dict[int, dict] = {}
    for delta in deltas:
        for part in delta.get("tool_calls", []):
            call = calls.setdefault(part["index"], {"name": "", "arguments": ""})
            call["name"] += part["function"].get("name") or ""
            call["arguments"] += part["function"].get("arguments") or ""
    return content, [calls[i] for i in sorted(calls)], stream.called


@pytest.mark.parametrize("preamble", ["", "Storing it now."])
def test_a_streamed_block_joins_to_the_unstreamed_message_wherever_the_pieces_break(preamble):
    text = preamble + render_dsml(DsmlFormat.V4, "record_echo", {"token": "A<B", "n": 3})
    whole = openai_api.chat_message(text, tools_requested=True)
    expected = [
        {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
        for c in whole["tool_calls"]
    ]
    for cut in range(len(text) + 1):
        content, calls, called = _streamed([text[:cut], text[cut:]])
        assert content == (whole["content"] or ""), cut
        assert calls == expected and called, cut
    content, calls, _ = _streamed(list(text))  # one character at a time
    assert content == (whole["content"] or "") and calls == expected


@pytest.mark.parametrize("text", ["a < b and <｜ but no block", "ends in a blank line\n\n"])
def test_streamed_text_without_a_block_is_all_content(text):
    for cut in range(len(text) + 1):
        assert _streamed([text[:cut], text[cut:]]) == (text, [], False)
