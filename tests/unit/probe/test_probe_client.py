"""The probe client's joining of a streamed chat answer (`client.joined`), usage included."""

from __future__ import annotations

import pytest

from dsv4_engine.probe.client import TransportError, joined, prompt_tokens


def test_streamed_deltas_join_as_an_openai_client_joins_them():
    chunks = [
        {"choices": [{"index": 0, "delta": {"content": "Storing."}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "call_1", "type": "function",
             "function": {"name": "record_echo", "arguments": ""}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": '{"token": '}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": '"A"}'}}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 57, "completion_tokens": 9}},
    ]  # fmt: skip
    reply = joined(chunks)
    (choice,) = reply["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Storing."
    (call,) = choice["message"]["tool_calls"]
    assert call["id"] == "call_1" and call["function"] == {
        "name": "record_echo",
        "arguments": '{"token": "A"}',
    }
    assert prompt_tokens(reply) == 57  # the last chunk's usage (stream_options.include_usage)


@pytest.mark.parametrize("usage", [None, {}, {"prompt_tokens": "7"}, {"prompt_tokens": -1}])
def test_a_reply_without_a_prompt_size_says_none(usage):
    assert prompt_tokens({"usage": usage}) is None


@pytest.mark.parametrize(
    "chunk",
    [
        {"choices": [{"delta": {"tool_calls": [{"function": {"arguments": "x"}}]}}]},  # no index
        {"choices": [{"delta": {"tool_calls": "call"}}]},
        {"choices": "none"},
    ],
)
def test_a_malformed_stream_chunk_is_a_failed_request(chunk):
    with pytest.raises(TransportError, match="a stream chunk is malformed"):
        joined([chunk])
