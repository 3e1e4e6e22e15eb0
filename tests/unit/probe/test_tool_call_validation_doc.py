"""docs/tool-call-validation.md stays true: its validator-vs-SGLang table and its per-class
scores are what the validator and SGLang 0.5.23's served parsers do on the corpus today."""

import pytest

from tests.unit.probe.validator_doc import WHY, Case, committed, crosscheck, sections

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    return crosscheck()


@pytest.mark.parametrize("name", ["crosscheck", "scores"])
def test_the_generated_sections_of_the_page_are_current(cases, name):
    assert committed(name) == sections(cases)[name], (
        "stale: run `$VENV/bin/python -m tests.unit.probe.validator_doc`"
    )


def test_every_disagreement_with_sglang_is_explained_and_nothing_else_is(cases):
    disagreeing = {c.edit for c in cases if not c.agree}
    assert disagreeing <= set(WHY), f"explain in WHY: {sorted(disagreeing - set(WHY))}"
    assert set(WHY) <= disagreeing, f"no longer a disagreement: {sorted(set(WHY) - disagreeing)}"
    assert len(cases) >= 200
