"""DeepSeek's own parser (deepseek-recipe) reads the same calls as the strict parser from every
valid corpus completion: "valid" means the same thing to the format's owner and to us."""

import json
from pathlib import Path

import pytest

from dsv4_engine.probe.dsml import DsmlFormat, parse, split_reasoning
from tests.unit.probe.served_parsers import recipe_serve

CORPUS = Path(__file__).parents[2] / "data" / "dsml_corpus"


@pytest.mark.parametrize("fmt", [DsmlFormat.V4, DsmlFormat.V41])
def test_deepseeks_parser_reads_the_same_calls_from_valid_corpus_completions(fmt):
    rows = [json.loads(line) for line in (CORPUS / f"corpus_{fmt}.jsonl").read_text().splitlines()]
    valid = [row for row in rows if row["label"] == "VALID"]
    assert len(valid) >= 10
    for row in valid:
        ours = tuple((c.name, c.args) for c in parse(split_reasoning(row["text"])[1], fmt))
        assert ours == recipe_serve(row["text"], fmt, row["tools"]).calls, row["id"]
