"""Producers of completions the validator was not written against, with their expected class.

One place for them, imported by the property tests (`test_dsml_properties`,
`test_validator_held_out`) and by `make bench-validator`, which scores the validator on a
held-out set drawn from a seed the tests never use.  Each producer makes one `Case` from a
generator:

* ``encoder``: a real-looking conversation (`conversations`) rendered by the format's own
  encoder (`encoders`): VALID by DeepSeek's word;
* ``sglang``: the same completion as SGLang's detector serves it (`served_parsers`), judged
  as the chat message a client gets (content and `tool_calls`): VALID — where SGLang serves
  other values than went in (it strips string values), only an echo could tell;
* ``mutation``: one token-stream mutation (`token_mutations`) of a single rendered call in
  its tool-call region, judged with the echo: VALID when the served text is unchanged;
  TRUNCATED or ENVELOPE_MISMATCH where the mutation decides the class by itself (the
  stream cut inside the block; the marker respelled as a look-alike); otherwise any class
  but VALID — or any class at all where SGLang and deepseek-recipe serve the very calls
  asked for from the mutated text (the validator may refuse what lenient parsers repair);
* ``loop``, ``salad``, ``garbled``: a derailed decoder — a few tokens of the prose or of a
  value repeated until max_tokens, or a long span (60 to 400 characters) of the reasoning,
  the prose or a value repeated a few times before the answer goes on; tokens from other
  scripts glued into the prose's words; byte tokens that form no UTF-8 character in the
  reasoning, the prose or a value — all DEGENERATE_TEXT;
* ``runaway``, ``special``: text after the block, where the format ends the turn, and a
  chat-template token mid-answer or mid-reasoning — DEGENERATE_TEXT (LEAKED_MARKUP too,
  for a second block);
* ``cycle``: a run of the turn's calls, with their arguments, written again back to back
  so that at least three calls repeat — DEGENERATE_TEXT;
* ``dialect``: the turn's first call written in another model family's tool-call dialect
  instead of the DSML block — LEAKED_MARKUP.

Half the realistic cases are judged with their prompt, half without (a user's log): the
judge must hold either way.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from jsonschema import Draft202012Validator

from dsv4_engine.probe.context import RequestContext
from dsv4_engine.probe.dsml import EOS, MARKER, DsmlFormat, split_reasoning
from dsv4_engine.probe.outcome import VALIDATOR_OUTCOMES, Judgement, Outcome
from dsv4_engine.probe.scripts import CJK, LATIN, script
from dsv4_engine.probe.tools import Echo
from dsv4_engine.probe.validate import classify_chat_message, classify_completion
from tests.unit.probe.conversations import conversation
from tests.unit.probe.dsml_strategies import SCRIPT_SAMPLES, Turn
from tests.unit.probe.encoders import render
from tests.unit.probe.served_parsers import recipe_serve, served_text, sglang_serve
from tests.unit.probe.token_mutations import SPECIAL_TOKENS, Kind, Mutation, tokenize

VALID = frozenset({Outcome.VALID})
DEGENERATE = frozenset({Outcome.DEGENERATE_TEXT})
LEAKED = frozenset({Outcome.LEAKED_MARKUP})
REFUSED = frozenset(VALIDATOR_OUTCOMES) - VALID
ANY = frozenset(VALIDATOR_OUTCOMES)


def validators(tools: list[dict]) -> dict[str, Draft202012Validator]:
    """`tool_validators` without its metaschema check (3 ms a tool set, most of an example's
    cost): the generators build valid schemas by construction."""
    return {t["function"]["name"]: Draft202012Validator(t["function"]["parameters"]) for t in tools}


def judge_turn(turn: Turn, text: str, fmt: DsmlFormat, prompt_known: bool = True) -> Judgement:
    """The validator on a completion of this turn, as a probe judges it: with the echo of
    the call when the turn makes one, and the request (its prompt when known)."""
    echo = Echo(*turn.calls[0]) if len(turn.calls) == 1 else None
    context = RequestContext.of(turn.prompt if prompt_known else None, turn.tools, echo)
    return classify_completion(text, fmt, validators(turn.tools), echo, context)


def block_mutation(rng: random.Random, tokens: list[str], text: str) -> Mutation:
    """One mutation whose site lies in the tool-call region: from the blank line before
    the block to end-of-sentence (a corrupted read in the prose changes prose, which the
    degeneracy producers cover)."""
    first, last = _block_tokens(tokens, text)
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


def _block_tokens(tokens: list[str], text: str) -> tuple[int, int]:
    """The first and last token index of the tool-call region (blank line to the end)."""
    answer_start = len(split_reasoning(text)[0])
    block_at = text.index("<" + MARKER, answer_start) - 2
    offsets = list(accumulate(map(len, tokens), initial=0))
    return next(i for i, o in enumerate(offsets) if o >= block_at), len(tokens) - 1


def served_unchanged(fmt: DsmlFormat, turn: Turn, text: str, mutated: str) -> bool:
    """Every served parser that reads the intact completion right (the calls asked for)
    serves the same calls from the mutated one — and at least one reads it right.  (Each
    has its own blind spots on intact text: SGLang strips string values, deepseek-recipe
    splits a parameter name at a space and passes control characters into its JSON.)"""
    asked = tuple(turn.calls)
    witnesses = [s for s in (sglang_serve, recipe_serve) if s(text, fmt, turn.tools).calls == asked]
    return bool(witnesses) and all(s(mutated, fmt, turn.tools).calls == asked for s in witnesses)


@dataclass(frozen=True)
class Case:
    """One completion to judge and the classes its producer allows: one class, or several
    where the construction does not decide it (a mutation: any refusal)."""

    producer: str
    fmt: DsmlFormat
    turn: Turn
    text: str
    accepted: frozenset[Outcome]
    prompt_known: bool = True
    message: dict[str, Any] | None = None
    """The chat message a server sent, when the case is judged as one (``sglang``)."""

    def judge(self) -> Judgement:
        if self.message is None:
            return judge_turn(self.turn, self.text, self.fmt, self.prompt_known)
        context = RequestContext.of(
            self.turn.prompt if self.prompt_known else None, self.turn.tools
        )
        return classify_chat_message(
            self.message, "tool_calls", self.fmt, validators(self.turn.tools), None, context
        )

    @property
    def label(self) -> Outcome | None:
        """The one class the case must get (None: several are right; not scored per class)."""
        return next(iter(self.accepted)) if len(self.accepted) == 1 else None

    def agrees(self, judged: Outcome) -> bool:
        return judged in self.accepted


def _rendered(rng: random.Random, fmt: DsmlFormat, single: bool = False) -> tuple[Turn, str]:
    turn = conversation(rng)
    if single:
        turn = Turn(turn.tools[:1], turn.calls[:1], turn.prompt, turn.prose, turn.reasoning)
    return turn, render(fmt, turn.tools, turn.calls, turn.prose, turn.reasoning)


def encoder_case(rng: random.Random, fmt: DsmlFormat) -> Case:
    turn, text = _rendered(rng, fmt)
    return Case("encoder", fmt, turn, text, VALID, rng.random() < 0.5)


def sglang_case(rng: random.Random, fmt: DsmlFormat) -> Case:
    """SGLang's served message for a rendered turn, judged without an echo."""
    turn, text = _rendered(rng, fmt)
    served = sglang_serve(text, fmt, turn.tools)
    calls = [
        {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": n, "arguments": json.dumps(a, ensure_ascii=False)},
        }
        for i, (n, a) in enumerate(served.calls)
    ]
    message = {"content": served.content or None, "tool_calls": calls}
    return Case("sglang", fmt, turn, text, VALID, rng.random() < 0.5, message)


def mutation_case(rng: random.Random, fmt: DsmlFormat) -> Case:
    turn, text = _rendered(rng, fmt, single=True)
    tokens = tokenize(text)
    mutation = block_mutation(rng, tokens, text)
    mutated = "".join(mutation.apply(tokens, tokenize(turn.prompt)))
    return Case("mutation", fmt, turn, mutated, _mutation_class(fmt, turn, text, mutated, mutation))


def _mutation_class(
    fmt: DsmlFormat, turn: Turn, text: str, mutated: str, mutation: Mutation
) -> frozenset[Outcome]:
    """The classes a mutation allows by construction, from the text and the served parsers
    (never from the validator)."""
    if served_text(mutated) == served_text(text):
        return VALID
    if served_unchanged(fmt, turn, text, mutated):
        return ANY
    block = text.index("<" + MARKER, len(split_reasoning(text)[0]))
    if mutation.kind is Kind.TRUNCATE and block < len(mutated) < len(served_text(text)):
        return frozenset({Outcome.TRUNCATED})
    if mutation.kind is Kind.MARKER_RESPELLED:
        return frozenset({Outcome.ENVELOPE_MISMATCH})
    return REFUSED


def _prose_span(text: str) -> tuple[int, int]:
    """Where the answer's prose lies in a rendered completion: after the reasoning, up to
    the blank line before the block."""
    start = len(split_reasoning(text)[0]) + (len("</think>") if "</think>" in text else 0)
    return start, text.index("<" + MARKER, start) - 2


def _with_prose(rng: random.Random, fmt: DsmlFormat, words: int) -> tuple[Turn, str, int, int]:
    """A rendered turn whose prose has at least `words` words of 4+ letters (re-drawn until
    it has)."""
    while True:
        turn, text = _rendered(rng, fmt)
        start, end = _prose_span(text)
        if len(_long_words(text[start:end].split(" "))) >= words:
            return turn, text, start, end


def _long_words(words: list[str]) -> list[int]:
    return [i for i, w in enumerate(words) if w.isalpha() and len(w) >= 4]


def _reasoning_span(rng: random.Random, fmt: DsmlFormat) -> tuple[Turn, str, int, int]:
    """A rendered turn with reasoning (re-drawn until it has some) and where it lies."""
    while True:
        turn, text = _rendered(rng, fmt)
        if turn.reasoning:
            return turn, text, 0, text.index("</think>")


def _span(rng: random.Random, fmt: DsmlFormat, where: str) -> tuple[Turn, str, int, int]:
    """A rendered turn and a span of its reasoning, prose or one of its string values."""
    if where == "reasoning":
        return _reasoning_span(rng, fmt)
    return _value_span(rng, fmt) if where == "value" else _with_prose(rng, fmt, 3)


def _value_span(rng: random.Random, fmt: DsmlFormat) -> tuple[Turn, str, int, int]:
    """A rendered turn and where one of its string values lies (re-drawn until it has one
    of 8+ characters)."""
    while True:
        turn, text = _rendered(rng, fmt)
        spans = [m.span(1) for m in _STRING_VALUE.finditer(text) if len(m[1]) >= 8]
        if spans:
            return turn, text, *rng.choice(spans)


_STRING_VALUE = re.compile(rf'string="true">(.*?)</{MARKER}', re.DOTALL)


def loop_case(rng: random.Random, fmt: DsmlFormat) -> Case:
    """The decoder stuck: half the time on a few tokens of its prose or of a value, repeated
    until max_tokens; otherwise on a long span, written a few times before it goes on."""
    if rng.random() < 0.5:
        return _long_loop_case(rng, fmt)
    in_value = rng.random() < 0.5
    turn, text, start, end = _span(rng, fmt, "value" if in_value else "prose")
    tokens = tokenize(text[start:end])
    at = rng.randint(2, len(tokens))
    unit = "".join(tokens[max(0, at - rng.randint(2, 10)) : at])
    if not unit.strip():
        unit = "".join(tokens[:at])
    repeats = max(rng.randint(8, 30), math.ceil(60 / len(unit)) + 1, 13)
    while unit * repeats in text:  # the request holds the values: copying them is no loop
        repeats += 1
    looped = text[:start] + "".join(tokens[:at]) + unit * repeats
    return Case("loop", fmt, turn, looped, DEGENERATE, rng.random() < 0.5)


def _long_loop_case(rng: random.Random, fmt: DsmlFormat) -> Case:
    """A sentence of 100 to 400 characters written 3 to 5 times, or of 40 to 99 written 5 to
    8 times, into the reasoning, the prose or a value; the answer then goes on as it was.
    A value is user data, judged only against a known prompt: those cases carry it."""
    where = rng.choice(("reasoning", "prose", "value"))
    turn, text, start, end = _span(rng, fmt, where)
    long = rng.random() < 0.5
    unit = _sentence(rng, rng.randint(100, 400) if long else rng.randint(40, 99))
    repeats = rng.randint(3, 5) if long else rng.randint(5, 8)
    at = rng.randint(start, end)
    looped = text[:at] + unit * repeats + text[at:]
    return Case("loop", fmt, turn, looped, DEGENERATE, where == "value" or rng.random() < 0.5)


def _sentence(rng: random.Random, size: int) -> str:
    """Words of any script, `size` characters with the space that ends them."""
    words: list[str] = []
    while sum(map(len, words)) + len(words) < size:
        words.append(rng.choice(SCRIPT_SAMPLES).split(" ")[0] + rng.choice(("", ",", ".")))
    return " ".join(words)[: size - 1] + " "


def salad_case(rng: random.Random, fmt: DsmlFormat) -> Case:
    """Tokens from unrelated vocabularies glued into the prose's words."""
    turn, text, start, end = _with_prose(rng, fmt, 2)
    words = text[start:end].split(" ")
    long = _long_words(words)
    for i in rng.sample(long, min(len(long), rng.randint(2, 4))):
        words[i] = _glue(rng, words[i])
    salad = text[:start] + " ".join(words) + text[end:]
    return Case("salad", fmt, turn, salad, DEGENERATE, rng.random() < 0.5)


def _glue(rng: random.Random, word: str) -> str:
    """A piece of another script's word inside this one, as a derailed decoder writes it.
    Not CJK into a Latin word or the reverse: Chinese technical text writes "Python的list"
    so, and the text alone cannot tell that from damage."""
    own = {script(c) for c in word} | {None}
    if own & {LATIN, CJK}:
        own |= {LATIN, CJK}
    other = rng.choice([s for s in SCRIPT_SAMPLES if script(s[0]) not in own])
    piece = other.replace(" ", "")[: rng.randint(2, 4)]
    cut = rng.randint(2, len(word) - 2)
    return word[:cut] + piece + word[cut:]


def garbled_case(rng: random.Random, fmt: DsmlFormat) -> Case:
    """Byte tokens that form no UTF-8 character in the reasoning, the prose or a value: the
    client sees U+FFFD, one or a run.  A value is user data, judged only against a known
    prompt: those cases carry it."""
    where = rng.choice(("reasoning", "prose", "value"))
    turn, text, start, end = _span(rng, fmt, where)
    garbled = text
    while "\ufffd" not in garbled:  # a continuation byte for one may spell another letter
        raw = bytearray(text[start:end].encode())
        at = rng.randrange(len(raw))
        run = rng.randint(1, 4)
        raw[at : at + run] = bytes(rng.randint(0x80, 0xBF) for _ in range(run))
        garbled = text[:start] + raw.decode(errors="replace") + text[end:]
    known = where == "value" or rng.random() < 0.5
    return Case("garbled", fmt, turn, garbled, DEGENERATE, known)


RUNAWAY_PROSE = ("\n\nDone!", "\n\nLet me know if you need anything else.", " 好的。", "\n")


def runaway_case(rng: random.Random, fmt: DsmlFormat) -> Case:
    """The decoder writes on past the block, where the format ends the turn: prose, or the
    block again (markup outside the block, and a runaway: either class names it), ending
    with end-of-sentence or running into max_tokens."""
    turn, text = _rendered(rng, fmt)
    body = served_text(text)
    if rng.random() < 0.5:
        tail, accepted = rng.choice(RUNAWAY_PROSE), DEGENERATE
    else:
        tail = body[text.index("<" + MARKER, len(split_reasoning(text)[0])) - 2 :]
        accepted = DEGENERATE | LEAKED
    ending = rng.choice((EOS, ""))
    return Case("runaway", fmt, turn, body + tail + ending, accepted, rng.random() < 0.5)


CHAT_TOKENS = ("<｜User｜>", "<｜Assistant｜>", "<think>", EOS)
"""Not ``</think>``: it ends the reasoning wherever it stands, so the text alone cannot
tell a stray one from the end of a thinking turn."""


def special_case(rng: random.Random, fmt: DsmlFormat) -> Case:
    """A chat-template token mid-answer or mid-reasoning, in the prose, a value or the
    reasoning: the tokenizer never makes one from text, only a derailed decoder writes it."""
    turn, text, start, end = _span(rng, fmt, rng.choice(("reasoning", "prose", "value")))
    token = rng.choice(CHAT_TOKENS)
    at = rng.randint(start + 1, end - 1)
    spliced = text[:at] + token + text[at:]
    return Case("special", fmt, turn, spliced, DEGENERATE, rng.random() < 0.5)


def cycle_case(rng: random.Random, fmt: DsmlFormat) -> Case:
    """A decoder stuck in the block: a run of one to three of the turn's calls, one with
    arguments at least, written again back to back — three times for one call, two or three
    for more (a pair of identical calls may be meant: a die rolled twice)."""
    while True:
        turn = conversation(rng)
        with_args = [i for i, (_, args) in enumerate(turn.calls) if args]
        if with_args:
            break
    first = rng.choice(with_args)
    size = rng.randint(1, min(3, len(turn.calls) - first))
    unit = turn.calls[first : first + size]
    times = 3 if size == 1 else rng.randint(2, 3)
    calls = [*turn.calls[: first + size], *unit * (times - 1), *turn.calls[first + size :]]
    cycled = Turn(turn.tools, calls, turn.prompt, turn.prose, turn.reasoning)
    text = render(fmt, cycled.tools, cycled.calls, cycled.prose, cycled.reasoning)
    return Case("cycle", fmt, cycled, text, DEGENERATE, rng.random() < 0.5)


def _hermes(name: str, args: dict[str, Any]) -> str:
    return f"<tool_call>\n{_json_call(name, args)}\n</tool_call>"


def _qwen3_coder(name: str, args: dict[str, Any]) -> str:
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def _llama_function(name: str, args: dict[str, Any]) -> str:
    return f"<function={name}>{json.dumps(args, ensure_ascii=False)}</function>"


def _deepseek_v3(name: str, args: dict[str, Any], bar: str = "｜") -> str:
    body = f"```json\n{json.dumps(args, ensure_ascii=False)}\n```"
    return (
        f"<{bar}tool▁calls▁begin{bar}><{bar}tool▁call▁begin{bar}>function<{bar}tool▁sep{bar}>"
        f"{name}\n{body}<{bar}tool▁call▁end{bar}><{bar}tool▁calls▁end{bar}>"
    )


def _mistral(name: str, args: dict[str, Any]) -> str:
    return f"[TOOL_CALLS][{_json_call(name, args)}]"


def _python_tag(name: str, args: dict[str, Any]) -> str:
    return f"<|python_tag|>{_json_call(name, args)}"


def _json_call(name: str, args: dict[str, Any]) -> str:
    return json.dumps({"name": name, "arguments": args}, ensure_ascii=False)


DIALECTS: tuple[Callable[[str, dict[str, Any]], str], ...] = (
    _hermes,
    _qwen3_coder,
    _llama_function,
    _deepseek_v3,
    lambda name, args: _deepseek_v3(name, args, "|"),
    _mistral,
    _python_tag,
)
"""Other model families' tool-call markup, as their chat templates write a call."""


def dialect_case(rng: random.Random, fmt: DsmlFormat) -> Case:
    """The turn's first call in another family's dialect where the DSML block stood: the
    model wrote a call no DeepSeek parser serves."""
    turn, text = _rendered(rng, fmt)
    block = text.index("<" + MARKER, len(split_reasoning(text)[0])) - 2
    markup = rng.choice(DIALECTS)(*turn.calls[0])
    foreign = text[:block] + "\n\n" + markup + EOS
    return Case("dialect", fmt, turn, foreign, LEAKED, rng.random() < 0.5)


PRODUCERS: dict[str, Callable[[random.Random, DsmlFormat], Case]] = {
    "encoder": encoder_case,
    "sglang": sglang_case,
    "mutation": mutation_case,
    "loop": loop_case,
    "salad": salad_case,
    "garbled": garbled_case,
    "runaway": runaway_case,
    "special": special_case,
    "cycle": cycle_case,
    "dialect": dialect_case,
}


def held_out(producer: str, fmt: DsmlFormat, seed: int, index: int) -> Case:
    """Case `index` of a producer for a format under `seed`: its generator is seeded by a
    string, so no held-out case shares a generator with the tests' integer seeds."""
    return PRODUCERS[producer](random.Random(f"held-out:{seed}:{producer}:{fmt}:{index}"), fmt)
