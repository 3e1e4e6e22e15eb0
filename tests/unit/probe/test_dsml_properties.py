"""Property-based: the validator against producers it did not write.

Valid side: random tool schemas and argument values (dsml_strategies), rendered by the
formats' own encoders (encoders.py), must all be VALID and parse back to exactly the calls
that went in.  Damaged side: one token-stream mutation (token_mutations.py) of a rendered
single call, judged with the echo of the requested call, must be not VALID — unless the
mutation provably leaves the call unchanged, which here means: the served parsers (SGLang
0.5.23's detector and deepseek-recipe) that read the intact completion right give the
client the very same calls from the mutated one (`_served_unchanged`).  The test counts
those exemptions by kind and bounds them.

Fixed seed (derandomize), no example database, no deadline: the same examples on every run.
Each Hypothesis example is a batch of `BATCH` completions from a seeded generator (see
dsml_strategies for why); rendering and judging one costs about a millisecond.
"""

from __future__ import annotations

import random
from collections import Counter
from itertools import accumulate

import pytest
from hypothesis import HealthCheck, given, settings
from jsonschema import Draft202012Validator

from dsv4_engine.probe.context import RequestContext
from dsv4_engine.probe.dsml import EOS, MARKER, DsmlFormat, parse, split_reasoning
from dsv4_engine.probe.outcome import Judgement
from dsv4_engine.probe.tools import Echo
from dsv4_engine.probe.validate import classify_completion
from tests.unit.probe.dsml_strategies import BATCH, Turn, batches
from tests.unit.probe.encoders import render
from tests.unit.probe.served_parsers import recipe_serve, sglang_serve
from tests.unit.probe.token_mutations import SPECIAL_TOKENS, Kind, Mutation, tokenize

pytestmark = pytest.mark.sglang  # V3.2's encoder and the served parsers are SGLang's

EXAMPLES = 2000
FORMATS = list(DsmlFormat)
PROPERTY = settings(
    max_examples=EXAMPLES // BATCH,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _judge(turn: Turn, text: str, fmt: DsmlFormat) -> Judgement:
    echo = Echo(*turn.calls[0]) if len(turn.calls) == 1 else None
    context = RequestContext.of(turn.prompt, turn.tools, echo)
    return classify_completion(text, fmt, _validators(turn.tools), echo, context)


def _validators(tools: list[dict]) -> dict[str, Draft202012Validator]:
    """`tool_validators` without its metaschema check (3 ms a tool set, most of an example's
    cost): `schema_of` builds valid schemas by construction."""
    return {t["function"]["name"]: Draft202012Validator(t["function"]["parameters"]) for t in tools}


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_completion_the_encoders_render_is_valid(fmt):
    seen = Counter()

    @PROPERTY
    @given(batches())
    def check(batch: tuple[random.Random, list[Turn]]) -> None:
        for turn in batch[1]:
            text = render(fmt, turn.tools, turn.calls, turn.prose, turn.reasoning)
            judged = _judge(turn, text, fmt)
            assert judged.valid, (judged.detail, turn, text)
            parsed = parse(split_reasoning(text)[1], fmt)
            assert [(c.name, c.args) for c in parsed] == turn.calls, text
            seen["completions"] += 1
            seen["calls"] += len(turn.calls)

    check()
    assert seen["completions"] >= EXAMPLES, seen


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_token_stream_mutation_is_caught_unless_the_served_call_is_unchanged(fmt):
    tally: Counter[str] = Counter()

    @PROPERTY
    @given(batches(max_calls=1))
    def check(batch: tuple[random.Random, list[Turn]]) -> None:
        rng, turns = batch
        for turn in turns:
            text = render(fmt, turn.tools, turn.calls, turn.prose, turn.reasoning)
            tokens = tokenize(text)
            assert "".join(tokens) == text
            mutation = _mutation(rng, tokens, text)
            mutated = "".join(mutation.apply(tokens, tokenize(turn.prompt)))
            tally[mutation.kind] += 1
            if mutated == text:
                tally["same text"] += 1
                continue
            judged = _judge(turn, mutated, fmt)
            if judged.valid:
                assert _served_unchanged(fmt, turn, text, mutated), (mutation, mutated)
                tally[f"unchanged for the client: {mutation.kind}"] += 1
            else:
                tally[judged.outcome] += 1

    check()
    print(fmt, dict(tally))
    assert sum(tally[k] for k in Kind) >= EXAMPLES
    unchanged = sum(n for k, n in tally.items() if str(k).startswith("unchanged"))
    assert unchanged < 0.1 * EXAMPLES, tally


def _served_unchanged(fmt: DsmlFormat, turn: Turn, text: str, mutated: str) -> bool:
    """Every served parser that reads the intact completion right (the calls asked for)
    serves the same calls from the mutated one — and at least one reads it right.  (Each
    has its own blind spots on intact text: SGLang strips string values, deepseek-recipe
    splits a parameter name at a space and passes control characters into its JSON.)"""
    asked = tuple(turn.calls)
    witnesses = [s for s in (sglang_serve, recipe_serve) if s(text, fmt, turn.tools).calls == asked]
    return bool(witnesses) and all(s(mutated, fmt, turn.tools).calls == asked for s in witnesses)


def _mutation(rng: random.Random, tokens: list[str], text: str) -> Mutation:
    """One mutation whose site lies in the tool-call region: from the blank line before
    the block to end-of-sentence (a corrupted read in the prose changes prose, which the
    degeneracy tests judge)."""
    answer_start = len(split_reasoning(text)[0])
    block_at = text.index("<" + MARKER, answer_start) - 2
    offsets = list(accumulate(map(len, tokens), initial=0))
    first = next(i for i, o in enumerate(offsets) if o >= block_at)
    last = len(tokens) - 1
    kind = rng.choice(list(Kind))
    if kind in (Kind.MARKER_BYTE, Kind.MARKER_RESPELLED):
        wanted = SPECIAL_TOKENS if kind is Kind.MARKER_BYTE else (MARKER,)
        at = rng.choice([i for i in range(first, last + 1) if tokens[i] in wanted])
        return Mutation(kind, at, rng.randrange(31), rng.randint(1, 255))
    size = {
        Kind.NEARBY: lambda: rng.choice([-8, -4, -3, -2, -1, 1, 2, 3, 4, 8]),
        Kind.FROM_CONTEXT: lambda: rng.randrange(10_000),
        Kind.DUPLICATE_SPAN: lambda: rng.randint(1, 16),
        Kind.DROP_SPAN: lambda: rng.randint(1, 16),
    }.get(kind, lambda: 1)
    return Mutation(kind, rng.randint(max(first, 1), last), size())


def test_the_tokenizer_keeps_special_tokens_whole_and_loses_nothing():
    text = 'Hi 你好.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n</｜DSML｜invoke>' + EOS
    tokens = tokenize(text)
    assert "".join(tokens) == text
    assert tokens.count(MARKER) == 3 and tokens[-1] == EOS
