"""The reference tokenizer's markup pieces: what a model may write as one token means the
same text as its bytes, and prompts never contain one."""

from __future__ import annotations

import random

import torch

from dsv4_engine.probe.dsml import DsmlFormat
from dsv4_engine.probe.dsml_format import render_dsml
from dsv4_engine.probe.workload import ECHO_TOOL, echo_instruction, random_echo
from dsv4_engine.reference import chat, tokenizer
from dsv4_engine.reference.model import ModelConfig, ReferenceModel


def test_output_written_in_pieces_decodes_to_the_same_text():
    rng = random.Random(0)
    for _ in range(50):
        echo = random_echo(rng)
        text = render_dsml(DsmlFormat.V4, echo.tool, echo.args)
        ids = tokenizer.encode_output(text)
        assert tokenizer.decode(ids) == text
        # The markup is pieces, the copied values bytes: about DeepSeek's ~100 tokens.
        assert len(ids) < len(text.encode()) / 3


def test_every_piece_is_one_token_and_unknown_text_stays_bytes():
    for i, piece in enumerate(tokenizer.PIECES):
        assert tokenizer.encode_output(piece) == [tokenizer.PIECES_AT + i]
    assert tokenizer.encode_output("<｜DSML｜other") == [
        tokenizer.special_id("<｜DSML｜"),
        *b"other",
    ]
    assert tokenizer.encode_output("é") == list("é".encode())


def test_a_prompt_is_bytes_and_special_tokens_only():
    """The chat template's DSML (the tool instructions, an earlier call) is read byte by
    byte: no piece id in a prompt, so the echo model's reader sees what it always saw."""
    echo = random_echo(random.Random(1))
    call = {"id": "c0", "type": "function",
            "function": {"name": echo.tool, "arguments": "{}"}}  # fmt: skip
    body = {
        "messages": [
            {"role": "user", "content": echo_instruction(echo)},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c0", "content": "stored"},
        ],
        "tools": [ECHO_TOOL],
    }
    assert max(chat.prompt_ids(body)) < tokenizer.PIECES_AT


def test_the_random_model_computes_with_the_same_weights_whatever_the_pieces(monkeypatch):
    """The random model never writes a piece; the race's effects on its answers were
    measured with its weights (tests/integration/test_reference_warm_vs_cold.py), so more
    pieces must not redraw them (one more had turned 4 differing answers of 4 into 1)."""
    before = ReferenceModel(ModelConfig())
    monkeypatch.setattr(tokenizer, "VOCAB_SIZE", tokenizer.VOCAB_SIZE + 5)
    after = ReferenceModel(ModelConfig())
    used = tokenizer.PIECES_AT  # bytes and special tokens
    assert torch.equal(before.embed[:used], after.embed[:used])
    assert torch.equal(before.unembed[:, :used], after.unembed[:, :used])
    for old, new in zip(before.layers, after.layers, strict=True):
        for a, b in zip(vars(old).values(), vars(new).values(), strict=True):
            assert (a is None and b is None) or torch.equal(a, b)
    assert after.embed.shape[0] == after.unembed.shape[1] == tokenizer.VOCAB_SIZE
