"""DeepSeek's own encoder (deepseek-recipe) renders calls; the strict parser must accept every
one of them and recover exactly the arguments that went in.  The encoder is the reference
for what valid output looks like; the validator stays the judge of damage."""

import json
import random
import string
from pathlib import Path

import deepseek_recipe as dr
import pytest

from dsv4_engine.probe.dsml import EOS, DsmlFormat, parse, split_reasoning
from dsv4_engine.probe.validate import classify_completion

ALPHABET = string.ascii_letters + string.digits + " -_.,:;/'\"{}[]()<>&\n"
UNICODE_VALUES = ["café naïve", "稀疏注意力", "Ωμέγα", "  padded  ", ""]


def _value(rng: random.Random, depth: int = 0):
    kind = rng.choice(
        ["str", "int", "float", "bool", "null", "list", "dict"][: 7 if depth < 2 else 5]
    )
    if kind == "str":
        if rng.random() < 0.3:
            return rng.choice(UNICODE_VALUES)
        return "".join(rng.choices(ALPHABET, k=rng.randrange(0, 24)))
    if kind == "int":
        return rng.randrange(-(10**9), 10**9)
    if kind == "float":
        return round(rng.uniform(-1e6, 1e6), 3)
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))]
    return {f"k{i}": _value(rng, depth + 1) for i in range(rng.randrange(0, 4))}


def _render(fmt: DsmlFormat, calls: list[tuple[str, dict]], prose: str, thinking: bool) -> str:
    encoding = dr.DeepseekV41Encoding() if fmt is DsmlFormat.V41 else dr.DeepseekV4Encoding()
    tool_calls = [dr.ToolCall(f"c{i}", n, json.dumps(a)) for i, (n, a) in enumerate(calls)]
    message = dr.AssistantMessage(
        prose, reasoning_content="thinking" if thinking else None, tool_calls=tool_calls
    )
    conv = dr.Conversation([dr.UserMessage("go"), message], thinking_mode=thinking)
    prompt = encoding.render_conversation(conv).prompt
    turn = prompt[
        prompt.rindex("<｜Assistant｜>", 0, prompt.rindex(EOS)) + len("<｜Assistant｜>") :
    ]
    text = turn[: turn.index(EOS) + len(EOS)].removeprefix("<think>" if thinking else "</think>")
    return text.replace("tool_calls>", "function_calls>") if fmt is DsmlFormat.V32 else text


@pytest.mark.parametrize("fmt", list(DsmlFormat))
def test_parser_accepts_what_deepseeks_encoder_renders(fmt):
    rng = random.Random(f"reference-{fmt}")
    for case in range(60):
        calls = [
            (f"tool_{rng.randrange(5)}", {f"p{j}": _value(rng) for j in range(rng.randrange(0, 5))})
            for _ in range(rng.randrange(1, 4))
        ]
        prose = rng.choice(["", "Calling the tool.", "好的，我来调用工具。"])
        text = _render(fmt, calls, prose, thinking=case % 3 == 0)
        assert classify_completion(text, fmt).valid, (case, text)
        parsed = parse(split_reasoning(text)[1], fmt)
        assert [(c.name, c.args) for c in parsed] == calls, text


def _recipe_calls(text: str, tools: list, model: str) -> list[tuple[str, dict]]:
    """The calls DeepSeek's own (lenient) response parser extracts from a completion."""
    body = {"model": model, "messages": [{"role": "user", "content": "go"}], "tools": tools}
    options = dr.ConversionOptions(default_thinking_mode="</think>" in text)
    request = dr.ChatCompletionRequest(body).convert(options)
    processor = dr.StreamProcessor(
        dr.ChatCompletionRequest.chunk_generator(request, "id", model), request.parsing_options
    )
    response = dr.ChatCompletionResponse("id", model, 0, 0, 0)
    for chunk in (
        processor.push(dr.InferenceChunk.ready())
        + processor.push(dr.InferenceChunk.text(text))
        + processor.push(dr.InferenceChunk.finish(dr.InferenceFinishReason.Stop))
        + processor.finish()
    ):
        response.accumulate(chunk)
    message = json.loads(response.to_json())["choices"][0]["message"]
    return [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in message.get("tool_calls") or []
    ]


@pytest.mark.parametrize(
    ("fmt", "model"), [("v4", "DeepSeek-V4-Pro"), ("v41", "DeepSeek-V4.1-Flash")]
)
def test_deepseeks_parser_reads_the_same_calls_from_valid_corpus_completions(fmt, model):
    corpus = Path(__file__).parents[2] / "data" / "dsml_corpus" / f"corpus_{fmt}.jsonl"
    valid = [json.loads(line) for line in corpus.read_text().splitlines()]
    valid = [row for row in valid if row["label"] == "VALID"]
    for row in valid:
        ours = [(c.name, c.args) for c in parse(split_reasoning(row["text"])[1], DsmlFormat(fmt))]
        assert ours == _recipe_calls(row["text"], row["tools"], model), row["id"]
