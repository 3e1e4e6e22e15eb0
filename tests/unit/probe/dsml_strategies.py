"""Random tool calls for the property tests: tool schemas and argument values.

Values cover what users really send: text in many scripts mixed with emoji, escapes and
markup characters, numbers at their limits, nested JSON.  Left out, because the format
cannot carry them (it has no escaping): the marker's bar ``｜`` (a value holding
``</｜DSML｜parameter>`` would end itself) and chat-template token spellings (``<think>``),
which the tokenizer never produces from a value.  Integers stay within 64 bits:
deepseek-recipe renders larger ones as floats (2**64 becomes 1.8446744073709552e+19), so
the encoder itself would not write the call asked for.  Parameter names hold no ``"``,
``<`` or ``>``: the encoders write them into an attribute unescaped.

Why seeded generators and not Hypothesis: a test must see the same examples however it
runs (alone, in its file, in the suite, in any order, under xdist), and Hypothesis does not
promise that even derandomized — with a small probability per draw it returns a constant
from a pool it mines from every project module imported so far (`_get_local_constants` in
6.170), so what earlier tests had imported changed the examples a test saw (a mutation
property passed in its file and failed alone).  It is slow here too: about 7 ms per
tool-call example, where ≥ 2,000 examples per format and property must take seconds on
this 2-core machine.  Here turn i comes from ``random.Random(i)`` (one sequence per seed
on the pinned Python), at ~0.1 ms a turn; a failure names its seed and `turn(seed)`
rebuilds the case.
"""

from __future__ import annotations

import json
import random
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import count
from typing import Any

SCRIPT_SAMPLES = (
    "Hello world",
    "مرحبا بالعالم",
    "Привет, мир",
    "你好，世界",
    "שלום עולם",
    "Γειά σου Κόσμε",
    "こんにちは",
    "안녕하세요",
    "नमस्ते",
    "สวัสดี",
    "👋🌍🎉🧪",
    "👨‍👩‍👧‍👦",
)
ESCAPES = ('"', "\\", "\n", "\t", "\r", "<", ">", "&", "{}", "[]", "/", "  ", "\u00a0", "\x00")
# Code point ranges a character is drawn from: ASCII, Latin-1 and Latin Extended, Greek and
# Cyrillic, Hebrew and Arabic, CJK, Hangul, emoji, and all of Unicode.
_RANGES = (
    (0x20, 0x7E),
    (0xA0, 0x24F),
    (0x370, 0x4FF),
    (0x590, 0x6FF),
    (0x4E00, 0x9FFF),
    (0xAC00, 0xD7A3),
    (0x1F300, 0x1FAFF),
    (0x0, 0x10FFFF),
)
INT_LIMITS = (0, -1, 2**53, 2**53 + 1, -(2**53), 2**63 - 1, -(2**63), 2**64 - 1)
FLOAT_LIMITS = (5e-324, -5e-324, 1.7976931348623157e308, 2.2250738585072014e-308, 0.1, -0.0)
KEYS = (
    "id",
    "city",
    "count",
    "query",
    "note",
    "城市",
    "название",
    "ürün_id",
    "key with spaces",
    "日付",
    "a",
    "x_1",
    "deeply_nested_key_name",
)
# (what the user asked, what the model answers before the call): the model answers in
# the user's language.
EXCHANGES = (
    ("Do it.", ""),
    ("Store these values.", "Storing them now."),
    ("Сохрани эти значения.", "Сохраняю."),
    ("请保存这些值。", "好的，我来调用工具。"),
    ("احفظ هذه القيم", "حسنًا، سأحفظها."),
    ("שמור את הערכים", "שומר עכשיו."),
    ("Αποθήκευσε τις τιμές.", "Αποθηκεύω τώρα. 👍"),
)


def _char(rng: random.Random) -> str:
    low, high = rng.choice(_RANGES)
    code = rng.randint(low, high)
    return "?" if 0xD800 <= code <= 0xDFFF or chr(code) == "｜" else chr(code)


def random_string(rng: random.Random) -> str:
    """Pieces of text in several scripts, emoji, escapes and random characters."""
    pieces = []
    for _ in range(rng.randint(0, 4)):
        kind = rng.randrange(3)
        if kind == 0:
            sample = rng.choice(SCRIPT_SAMPLES)
            start = rng.randrange(len(sample))
            pieces.append(sample[start : start + rng.randint(1, len(sample))])
        elif kind == 1:
            pieces.append(rng.choice(ESCAPES))
        else:
            pieces.append("".join(_char(rng) for _ in range(rng.randint(1, 6))))
    return "".join(pieces).replace("think>", "think")


def _float(rng: random.Random) -> float:
    """Any finite double (from random bits), or one at a limit."""
    if rng.random() < 0.3:
        return rng.choice(FLOAT_LIMITS)
    value = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
    return value if value == value and abs(value) != float("inf") else 0.5


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.choice(("str", "str", "int", "float", "bool", "null", "list", "dict"))
    if kind == "str":
        return random_string(rng)
    if kind == "int":
        return rng.choice(INT_LIMITS) if rng.random() < 0.3 else rng.randint(-(2**63), 2**64 - 1)
    if kind == "float":
        return _float(rng)
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null" or depth >= 2:
        return None
    size = rng.randint(0, 3)
    if kind == "list":
        return [random_value(rng, depth + 1) for _ in range(size)]
    return {rng.choice(KEYS): random_value(rng, depth + 1) for _ in range(size)}


def schema_of(value: Any) -> dict[str, Any]:
    """The JSON schema a value satisfies (its type, recursively)."""
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "integer"}
    if isinstance(value, float):
        return {"type": "number"}
    if isinstance(value, str):
        return {"type": "string"}
    if value is None:
        return {"type": "null"}
    if isinstance(value, list):
        return {"type": "array"}
    return {
        "type": "object",
        "properties": {k: schema_of(v) for k, v in value.items()},
        "required": sorted(value),
    }


@dataclass(frozen=True)
class Turn:
    """One assistant turn to render: the request (tools, prompt) and the answer's parts."""

    tools: list[dict[str, Any]]
    calls: list[tuple[str, dict[str, Any]]]
    prompt: str
    prose: str
    reasoning: str | None

    @classmethod
    def of(
        cls,
        calls: list[tuple[str, dict[str, Any]]],
        exchange: tuple[str, str],
        reasoning: str | None,
    ) -> Turn:
        """The turn that makes these calls: a tool for each (its schema from the arguments),
        and a prompt that asks for them (the `exchange`'s question and the calls as JSON)."""
        tools = [
            {"type": "function", "function": {"name": name, "parameters": schema_of(args)}}
            for name, args in calls
        ]
        question, prose = exchange
        requested = json.dumps([{"tool": n, "args": a} for n, a in calls], ensure_ascii=False)
        return cls(tools, calls, f"{question} {requested}", prose, reasoning)


def random_turn(rng: random.Random, max_calls: int = 3) -> Turn:
    names = rng.sample(
        [f"{verb}_{i}" for verb in ("get", "set", "find") for i in range(9)],
        k=rng.randint(1, max_calls),
    )
    calls = [
        (name, {k: random_value(rng) for k in rng.sample(KEYS, rng.randint(0, 5))})
        for name in names
    ]
    exchange = rng.choice(EXCHANGES)
    return Turn.of(calls, exchange, rng.choice((None, None, "I call the tool.", "先调用工具。")))


def turn(seed: int, max_calls: int = 3) -> tuple[random.Random, Turn]:
    """The turn of this seed, and its generator (for the choices a test makes next, such as
    a mutation)."""
    rng = random.Random(seed)
    return rng, random_turn(rng, max_calls)


def turns(max_calls: int = 3) -> Iterator[tuple[int, random.Random, Turn]]:
    """The turns of seeds 0, 1, 2 …, each with its seed and generator."""
    for seed in count():
        yield seed, *turn(seed, max_calls)
