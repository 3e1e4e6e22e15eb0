"""Prompts and echo requests, generated from a seed so a run can be replayed exactly.

Filler text is drawn from a small English vocabulary: roughly one token per word for
DeepSeek's tokenizer, so word counts stand in for token counts (no tokenizer needed in the
operator image).  Echo values are random IDs from an alphabet without look-alikes, so a
model that follows instructions copies them exactly and any change is damage.
"""

from __future__ import annotations

import json
import random
import string
from typing import Any

from dsv4_engine.probe.tools import Echo

ECHO_TOOL_NAME = "record_echo"
_ID_ALPHABET = "".join(c for c in string.ascii_uppercase + string.digits if c not in "0O1IL")
_VOCABULARY = (
    "the of and to in is was for on that with as by at from his her an which this be are "
    "river mountain ledger copper harbor winter signal garden lantern orbit meadow quarry "
    "engine canyon violet anchor marble thunder willow compass falcon ember glacier harvest "
    "island jasmine kernel lattice mirror nectar oyster pepper quartz ribbon saddle timber "
    "umbrella velvet walnut yonder zephyr basin cedar delta fjord grove hollow inlet jetty"
).split()

ECHO_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": ECHO_TOOL_NAME,
        "description": "Store a record. Every argument must be copied exactly as given.",
        "parameters": {
            "type": "object",
            "properties": {
                "record_id": {"type": "string", "pattern": "^R-[A-Z0-9]{12}$"},
                "token": {"type": "string", "minLength": 16, "maxLength": 16},
                "count": {"type": "integer", "minimum": 0, "maximum": 999999},
                "urgent": {"type": "boolean"},
            },
            "required": ["record_id", "token", "count", "urgent"],
            "additionalProperties": False,
        },
    },
}


def random_echo(rng: random.Random) -> Echo:
    return Echo(
        ECHO_TOOL_NAME,
        {
            "record_id": "R-" + "".join(rng.choices(_ID_ALPHABET, k=12)),
            "token": "".join(rng.choices(_ID_ALPHABET, k=16)),
            "count": rng.randrange(1_000_000),
            "urgent": rng.random() < 0.5,
        },
        schema_valid=True,
    )


def echo_instruction(echo: Echo) -> str:
    return (
        f"Call the tool {echo.tool} exactly once with these arguments (JSON), every value "
        f"copied character for character: {json.dumps(echo.args)}. Do not write anything else."
    )


def filler(rng: random.Random, words: int) -> str:
    """`words` words of plausible-looking text in sentences of 12 words."""
    picked = rng.choices(_VOCABULARY, k=words)
    sentences = [" ".join(picked[i : i + 12]).capitalize() + "." for i in range(0, words, 12)]
    return " ".join(sentences)


def document(rng: random.Random, words: int, label: str) -> str:
    """A long context the prompt refers to, tagged so two documents never share a prefix."""
    return f"Document {label}:\n{filler(rng, words)}\nEnd of document {label}."
