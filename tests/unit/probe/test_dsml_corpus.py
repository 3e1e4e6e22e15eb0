"""The strict validator against the labelled corpus (tests/data/dsml_corpus, see make_corpus.py).

Accuracy must be ≥ 99%; any mistake is printed with its id, label and the validator's
reason, so a regression shows exactly which completion it misjudges.
"""

import json
from collections import Counter
from pathlib import Path

import pytest

from dsv4_engine.probe.dsml import DsmlFormat
from dsv4_engine.probe.outcome import VALIDATOR_OUTCOMES
from dsv4_engine.probe.validate import classify_records
from tests.data.dsml_corpus.make_corpus import SHAPES, corpus

CORPUS = Path(__file__).parents[2] / "data" / "dsml_corpus"
FORMATS = [f.value for f in DsmlFormat]


def _load(fmt: str) -> list[dict]:
    return [json.loads(line) for line in (CORPUS / f"corpus_{fmt}.jsonl").read_text().splitlines()]


def _judge(fmt: str) -> list[tuple[dict, str, str]]:
    path = CORPUS / f"corpus_{fmt}.jsonl"
    results = classify_records(path.read_text().splitlines(), DsmlFormat(fmt), path.name)
    return [
        (row, r.judgement.outcome.value, r.judgement.detail)
        for row, r in zip(_load(fmt), results, strict=True)
    ]


def test_corpus_is_large_and_covers_every_class_in_every_format():
    rows = [row for fmt in FORMATS for row in _load(fmt)]
    assert len(rows) >= 100
    for fmt in FORMATS:
        labels = Counter(row["label"] for row in _load(fmt))
        assert set(labels) == {o.value for o in VALIDATOR_OUTCOMES}, fmt
        assert labels["VALID"] >= 5


def test_validator_accuracy_on_the_corpus():
    judged = [item for fmt in FORMATS for item in _judge(fmt)]
    mistakes = [
        f"{row['id']}: labelled {row['label']}, judged {got} ({detail})"
        for row, got, detail in judged
        if got != row["label"]
    ]
    accuracy = 1 - len(mistakes) / len(judged)
    print(f"accuracy {accuracy:.2%} on {len(judged)} completions; mistakes:", *mistakes, sep="\n  ")
    assert accuracy >= 0.99, "\n".join(mistakes)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_valid_completion_of_one_format_is_an_envelope_mismatch_in_the_others(fmt):
    """The three formats differ only in tag spelling; the validator must not confuse them."""
    valid = [row for row in _load(fmt) if row["label"] == "VALID" and "DSML" in row["text"]]
    for other in FORMATS:
        if other == fmt:
            continue
        path = f"corpus_{fmt}.jsonl as {other}"
        lines = [json.dumps(row) for row in valid]
        outcomes = {
            r.judgement.outcome.value for r in classify_records(lines, DsmlFormat(other), path)
        }
        assert outcomes == {"ENVELOPE_MISMATCH"}, (fmt, other, outcomes)


@pytest.mark.parametrize(
    "fmt",
    [pytest.param(f, marks=pytest.mark.sglang) if f == "v32" else f for f in FORMATS],
)
def test_the_committed_corpus_is_what_its_generator_writes(fmt):
    """One source of truth: make_corpus.py (the V3.2 encoder is SGLang's)."""
    assert corpus(fmt) == (CORPUS / f"corpus_{fmt}.jsonl").read_text().splitlines()


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_production_shape_is_in_the_corpus_and_judged_as_labelled(fmt):
    """What `make bench-validator` reports per shape: full recall on the corrupt shapes (loops,
    invoke cycles, U+FFFD runs, role tokens, foreign dialects), no false alarm on the valid
    guards (repetitive values, parallel calls, multilingual text) nor anywhere else."""
    judged = _judge(fmt)
    assert {row.get("shape") for row, _, _ in judged} == {*SHAPES, None}
    alarms = [row["id"] for row, got, _ in judged if row["label"] == "VALID" != got]
    missed = [row["id"] for row, got, _ in judged if "shape" in row and got != row["label"]]
    assert not alarms and not missed, (alarms, missed)
