"""Property-based: the validator against producers it did not write.

Valid side: random tool schemas and argument values (dsml_strategies), rendered by the
formats' own encoders (encoders.py), must all be VALID and parse back to exactly the calls
that went in.  Damaged side: one token-stream mutation (token_mutations.py) of a rendered
single call, judged with the echo of the requested call, must be not VALID unless the
mutation provably leaves the call unchanged; the test runs until 2,000 mutations that
change the text a client is served have been judged.  Two proofs count:

- the served text is the same (`served_text`): the mutation changed nothing, or removed
  only end-of-sentence, which no client ever sees.  The validator must then say VALID.  This
  is read off the text, not asked of the parsers: a lost end-of-sentence once failed the
  test on a turn that no served parser reads right even intact, so the rule below had no
  witness to ask (`test_a_lost_end_of_sentence_..._no_served_parser_reads_right`);
- the served parsers (SGLang 0.5.23's detector and deepseek-recipe) that read the intact
  completion right give the client the very same calls from the mutated one
  (`served_unchanged`: a float digit past double precision, a JSON key repeated with its
  value).  The test counts these exemptions by kind and bounds them.

Fixed seeds: the i-th example is `turn(i)` (dsml_strategies says why not Hypothesis), so
the same examples however the test runs — alone, in its file, in the suite, in any order,
under xdist — and a failure names its seed.  Rendering and judging one costs about a
millisecond.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from itertools import islice
from pathlib import Path

import pytest

from dsv4_engine.probe.dsml import EOS, MARKER, DsmlFormat, parse, split_reasoning
from tests.unit.probe.dsml_strategies import Turn, turns
from tests.unit.probe.encoders import render
from tests.unit.probe.producers import block_mutation, judge_turn, served_unchanged
from tests.unit.probe.served_parsers import recipe_serve, served_text, sglang_serve
from tests.unit.probe.token_mutations import Kind, Mutation, tokenize

pytestmark = pytest.mark.sglang  # V3.2's encoder and the served parsers are SGLang's

EXAMPLES = 2000
FORMATS = list(DsmlFormat)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_completion_the_encoders_render_is_valid(fmt):
    several = 0
    for seed, _, turn in islice(turns(), EXAMPLES):
        text = render(fmt, turn.tools, turn.calls, turn.prose, turn.reasoning)
        judged = judge_turn(turn, text, fmt)
        assert judged.valid, (seed, judged.detail, text)
        parsed = parse(split_reasoning(text)[1], fmt)
        assert [(c.name, c.args) for c in parsed] == turn.calls, (seed, text)
        several += len(turn.calls) > 1
    assert several >= EXAMPLES // 2, f"only {several} turns of several calls"


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_token_stream_mutation_is_caught_unless_the_served_call_is_unchanged(fmt):
    tally: Counter[str] = Counter()
    changed = 0
    for seed, rng, turn in turns(max_calls=1):
        text = render(fmt, turn.tools, turn.calls, turn.prose, turn.reasoning)
        tokens = tokenize(text)
        assert "".join(tokens) == text
        mutation = block_mutation(rng, tokens, text)
        mutated = "".join(mutation.apply(tokens, tokenize(turn.prompt)))
        tally[mutation.kind] += 1
        judged = judge_turn(turn, mutated, fmt)
        if served_text(mutated) == served_text(text):
            assert judged.valid, (seed, mutation, judged.detail)
            tally["same served text"] += 1
            continue
        if judged.valid:
            assert served_unchanged(fmt, turn, text, mutated), (seed, mutation, mutated)
            tally[f"unchanged for the client: {mutation.kind}"] += 1
        else:
            tally[judged.outcome] += 1
        changed += 1
        if changed == EXAMPLES:
            break
    print(fmt, dict(tally))
    assert set(tally) >= set(Kind), tally
    unchanged = sum(n for k, n in tally.items() if str(k).startswith("unchanged"))
    assert unchanged < 0.1 * EXAMPLES, tally


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_lost_end_of_sentence_changes_no_call_even_one_no_served_parser_reads_right(fmt):
    """The counterexample behind the served-text proof, found on V4.1: a dropped span took
    the turn's last token, end-of-sentence.  Neither served parser reads this turn right
    even intact — SGLang strips the string value's leading carriage return, deepseek-recipe
    splits the parameter name ``key with spaces`` at its space — so `_served_unchanged` had
    no witness and called the drop a missed corruption.  It is none: each parser serves the
    mutated text exactly as the intact one, and the validator is right to say VALID."""
    args = {
        "city": -11.871436913648232,
        "key with spaces": 5e-324,
        "note": 16893424633699831800,
        "query": "\r🍝İѕ뙵u🩍ѷǶٝ餼ξ",
    }
    turn = Turn.of([("set_0", args)], ("Сохрани эти значения.", "Сохраняю."), None)
    text = render(fmt, turn.tools, turn.calls, turn.prose, turn.reasoning)
    tokens = tokenize(text)
    dropped = Mutation(Kind.DROP_SPAN, len(tokens) - 1, 14).apply(tokens, tokenize(turn.prompt))
    mutated = "".join(dropped)
    assert mutated == text.removesuffix(EOS)  # the span held only end-of-sentence
    assert judge_turn(turn, mutated, fmt).valid
    for serve in (sglang_serve, recipe_serve):
        intact = serve(text, fmt, turn.tools)
        assert intact.calls != tuple(turn.calls), f"{serve.__name__} reads it right now"
        assert serve(mutated, fmt, turn.tools) == intact, serve.__name__


def test_the_examples_do_not_depend_on_what_the_process_ran_before():
    """The turns this process generates, after whatever tests ran in it, are the turns of a
    fresh interpreter that imported nothing else — the guarantee Hypothesis did not give
    (see dsml_strategies), which made a property pass in its file and fail alone."""
    code = (
        "from itertools import islice; from tests.unit.probe.dsml_strategies import turns; "
        "print(ascii([t for _, _, t in islice(turns(), 200)]))"
    )
    root = Path(__file__).resolve().parents[3]
    fresh = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stdout.strip() == ascii([t for _, _, t in islice(turns(), 200)])


def test_the_tokenizer_keeps_special_tokens_whole_and_loses_nothing():
    text = 'Hi 你好.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n</｜DSML｜invoke>' + EOS
    tokens = tokenize(text)
    assert "".join(tokens) == text
    assert tokens.count(MARKER) == 3 and tokens[-1] == EOS
