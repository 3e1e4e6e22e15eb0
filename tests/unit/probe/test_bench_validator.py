"""`make bench-validator` prints what docs/tool-call-validation.md says it prints: the recall
on each corrupt production shape, the false alarms on each valid guard and on the whole
valid corpus, and the validator's time on long answers."""

from bench.bench_validator import (
    CORPUS,
    LONG_SIZES,
    judged_corpus,
    long_output_report,
    shapes_report,
)
from dsv4_engine.probe.dsml import DsmlFormat
from tests.data.dsml_corpus.make_corpus import SHAPES


def test_the_bench_prints_each_shape_and_the_false_alarms_on_the_valid_corpus(capsys):
    lines = {f: (CORPUS / f"corpus_{f}.jsonl").read_text().splitlines() for f in DsmlFormat}
    shapes_report(judged_corpus(lines))
    out = capsys.readouterr().out.splitlines()
    for shape in SHAPES:
        (line,) = [line for line in out if line.strip().startswith(shape + " ")]
        assert "recall" in line and line.endswith("= 100.0%") or " 0 false alarms" in line, line
    assert [line for line in out if line.startswith("false alarms on the valid corpus: 0 of")]


def test_the_bench_prints_the_time_on_long_answers_of_8k_to_32k_characters(capsys):
    long_output_report()
    timed = [line.split() for line in capsys.readouterr().out.splitlines() if " ms " in line]
    assert len(timed) == 4 * len(LONG_SIZES)
    assert {round(int(row[0]), -3) for row in timed} == set(LONG_SIZES)
    kinds = {(row[2], row[-1]) for row in timed}  # the answer's first word, its verdict
    valid = {("markdown", "VALID"), ("CSV", "VALID"), ("log", "VALID")}
    assert kinds == valid | {("loop", "DEGENERATE_TEXT")}
