"""The probes: a workload shape (single request, shared prefix, long context) × a check
(tool-call echo, or cold-vs-warm consistency).  One sample = one call of `run_sample`.

Each sample draws its randomness from (seed, sample index), so a report's failing sample
can be replayed alone.  Shared prefixes are generated once per group and reused, group
after group, by the samples of the prefix-reuse probes: that is what makes prefix-cache hits
happen under load and, once the groups' prefixes together outgrow the engine's device pool
(`ProbeContext.prefix_groups`, sized by the runner from the pool the engines report), makes
a reused prefix come back from the host tier, where the seed's race lived.

Every sample also keeps the prompt sizes of the requests it sent (`PromptTokens`), judged
or not: the runner's bound on how many judged answers read from the host tier rests on them.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field
from typing import Any

from dsv4_engine.probe.client import ChatAnswer, EngineClient, TransportError
from dsv4_engine.probe.context import RequestContext
from dsv4_engine.probe.dsml_format import render_dsml
from dsv4_engine.probe.evidence import prompt_token_bound
from dsv4_engine.probe.outcome import VALID, Judgement, Outcome
from dsv4_engine.probe.settings import ProbeName, ProbeSettings
from dsv4_engine.probe.tools import Echo, tool_validators
from dsv4_engine.probe.validate import classify_chat_message
from dsv4_engine.probe.workload import ECHO_TOOL, document, echo_instruction, filler, random_echo

EXCERPT_CHARS = 400
_ECHO_VALIDATORS = tool_validators([ECHO_TOOL])


@dataclass(frozen=True)
class Sample:
    index: int
    probe: ProbeName
    outcome: Outcome
    detail: str
    latency_s: float | None
    """Latency of the last judged request (None when no answer came back)."""
    excerpt: str = ""
    expected: str = ""
    """What a clean answer is: the requested call in DSML, or the cold answer."""
    judged_prompts: tuple[int, ...] = ()
    """The prompt size of each request whose answer the sample judged (`PromptTokens`)."""
    unjudged_tokens: int = 0
    """The prompt tokens of its requests whose answers were not judged (failed, or the
    offload knob's priming request)."""
    streamed: bool = False
    """The judged answer was streamed (`ProbeSettings.stream_share`)."""
    baseline_diverged: bool | None = None
    """A differential consistency sample (`Baseline`): whether the baseline's warm answer
    differed from its cold one; None: no baseline answer (or not differential)."""


@dataclass
class PromptTokens:
    """The prompt sizes of a sample's requests to the engine under test, judged or not:
    each answer's `usage.prompt_tokens`, or the most its prompt can be
    (`evidence.prompt_token_bound`) where no answer said, so no size is below what was sent.
    A request that failed has no judged answer."""

    judged: list[int] = field(default_factory=list)
    unjudged: int = 0

    async def ask(
        self, client: EngineClient, body: dict[str, Any], judged: bool = True
    ) -> ChatAnswer:
        try:
            answer = await client.chat(body)
        except TransportError:
            self.unjudged += prompt_token_bound(body)
            raise
        size = answer.prompt_tokens
        size = prompt_token_bound(body) if size is None else size
        if judged:
            self.judged.append(size)
        else:
            self.unjudged += size
        return answer


@dataclass(frozen=True)
class Checked:
    """What one check found: the judgement, the answer judged and a clean answer to show
    beside it."""

    judgement: Judgement
    answer: ChatAnswer
    expected: str
    baseline_diverged: bool | None = None


@dataclass(frozen=True)
class Baseline:
    """The stable side a differential consistency sample also asks (`baseline_url`)."""

    client: EngineClient
    model: str
    offload_path: str | None
    """Its host-tier push, when it serves one (a stable without HiCache does not)."""


@dataclass
class ProbeContext:
    client: EngineClient
    settings: ProbeSettings
    model: str
    host_round_trip: bool = False
    """True when the engine pushes cached prefixes to its host tier on request (the
    reference engine): each echo request is then answered while its prefix loads back."""
    baseline: Baseline | None = None
    """Set when the engine is not deterministic and a baseline answers: consistency is
    then differential."""
    prefix_groups: int | None = None
    """Shared prefixes to cycle through; None: `concurrency / sessions_per_prefix`."""
    _prefixes: dict[int, str] = field(default_factory=dict)

    @property
    def groups(self) -> int:
        default = max(1, self.settings.concurrency // self.settings.sessions_per_prefix)
        return self.prefix_groups or default

    def shared_prefix(self, use: int) -> str:
        """The prefix of a prefix-reuse probe's ``use``-th sample: the groups in turn, so
        that a group comes back after every other group's prefix went through the cache."""
        group = use % self.groups
        if group not in self._prefixes:
            rng = random.Random(f"{self.settings.seed}:prefix:{group}")
            self._prefixes[group] = document(rng, self.settings.shared_prefix_words, f"P{group}")
        return self._prefixes[group]

    def body(self, messages: list[dict[str, Any]], max_tokens: int, tools: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": False,
        }
        if tools:
            # "auto", never "required": forcing the call turns on constrained decoding,
            # which would hide exactly the malformed output we are looking for.
            body["tools"], body["tool_choice"] = [ECHO_TOOL], "auto"
        return body


def excerpt(answer: ChatAnswer) -> str:
    text = answer.message.get("content") or ""
    if answer.message.get("tool_calls"):
        text += " tool_calls=" + json.dumps(answer.message["tool_calls"], ensure_ascii=False)
    return text[:EXCERPT_CHARS]


async def run_sample(probe: ProbeName, index: int, ctx: ProbeContext, use: int = 0) -> Sample:
    """Sample ``index`` of ``probe``, its ``use``-th (which shared prefix it takes)."""
    rng = random.Random(f"{ctx.settings.seed}:{index}")
    spent = PromptTokens()
    try:
        check = _consistency if probe.needs_determinism else _echo
        checked = await check(probe, index, use, rng, ctx, spent)
    except TransportError as err:
        return Sample(index, probe, Outcome.TRANSPORT_ERROR, str(err), None,
                      judged_prompts=tuple(spent.judged), unjudged_tokens=spent.unjudged)  # fmt: skip
    return Sample(
        index,
        probe,
        checked.judgement.outcome,
        checked.judgement.detail,
        checked.answer.latency_s,
        excerpt(checked.answer),
        checked.expected[:EXCERPT_CHARS],
        tuple(spent.judged),
        spent.unjudged,
        checked.answer.streamed,
        baseline_diverged=checked.baseline_diverged,
    )


async def _echo(
    probe: ProbeName,
    index: int,
    use: int,
    rng: random.Random,
    ctx: ProbeContext,
    spent: PromptTokens,
) -> Checked:
    messages: list[dict[str, Any]] = []
    if probe is ProbeName.TOOLCALL_ECHO_PREFIX_REUSE:
        messages.append({"role": "system", "content": ctx.shared_prefix(use)})
    elif probe is ProbeName.TOOLCALL_ECHO_LONG_CONTEXT:
        doc = document(rng, ctx.settings.long_prompt_words, f"L{index}")
        messages.append({"role": "system", "content": doc})
    turns = 2 if probe is ProbeName.TOOLCALL_ECHO_PREFIX_REUSE else 1
    # Its own draw, so the share streamed changes nothing else about the sample.
    streams = random.Random(f"{ctx.settings.seed}:{index}:stream").random()
    stream = streams < ctx.settings.stream_share
    for turn in range(turns):
        echo = random_echo(rng)
        messages.append({"role": "user", "content": echo_instruction(echo)})
        body = ctx.body(messages, ctx.settings.echo_tokens, tools=True)
        if ctx.host_round_trip:
            await _through_host_tier(ctx, body, spent)
        answer = await spent.ask(ctx.client, {**body, "stream": stream})
        judgement = classify_chat_message(
            answer.message,
            answer.finish_reason,
            ctx.settings.format,
            _ECHO_VALIDATORS,
            echo,
            RequestContext.of(messages, [ECHO_TOOL], echo),
        )
        expected = render_dsml(ctx.settings.format, echo.tool, echo.args)
        if not judgement.valid:
            return Checked(judgement, answer, expected)
        messages.extend(_requested_turn(echo, f"call_{index}_{turn}"))
    return Checked(judgement, answer, expected)


async def _through_host_tier(ctx: ProbeContext, body: dict[str, Any], spent: PromptTokens) -> None:
    """The reference-only test knob (`ProbeSettings.admin_offload_path`): put the request's
    prompt in the prefix cache (a one-token answer), then push the cache to the host tier,
    so the judged request loads its prefix back while it runs."""
    await spent.ask(ctx.client, {**body, "max_tokens": 1}, judged=False)
    assert ctx.settings.offload_path is not None
    await ctx.client.offload(ctx.settings.offload_path)


def _requested_turn(echo: Echo, call_id: str) -> list[dict[str, Any]]:
    """The history of a correct turn: the call as requested and the tool's reply, so the
    next turn's prompt extends a prefix the engine has already cached."""
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": echo.tool, "arguments": json.dumps(echo.args)},
    }
    return [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": "stored"},
    ]


async def _consistency(
    probe: ProbeName,
    index: int,
    use: int,
    rng: random.Random,
    ctx: ProbeContext,
    spent: PromptTokens,
) -> Checked:
    if probe is ProbeName.CACHE_CONSISTENCY_PREFIX_REUSE:
        system = ctx.shared_prefix(use)
    elif probe is ProbeName.CACHE_CONSISTENCY_LONG_CONTEXT:
        system = document(rng, ctx.settings.long_prompt_words, f"L{index}")
    else:
        system = document(rng, ctx.settings.single_prompt_words, f"S{index}")
    question = f"Request {index}: continue the text. {filler(rng, 24)}"
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    body = ctx.body(messages, ctx.settings.consistency_tokens, tools=False)
    if ctx.baseline is None:
        cold, warm = await _cold_then_warm(ctx.client, body, ctx.settings.offload_path, spent)
        if cold.comparable == warm.comparable:
            return Checked(VALID, warm, excerpt(cold))
        mismatch = Judgement(Outcome.CACHE_MISMATCH, _first_difference(cold, warm))
        return Checked(mismatch, warm, excerpt(cold))
    return await _differential(ctx, ctx.baseline, body, spent)


async def _cold_then_warm(
    client: EngineClient, body: dict[str, Any], offload_path: str | None, spent: PromptTokens
) -> tuple[ChatAnswer, ChatAnswer]:
    """The same greedy request twice: the second finds its prefix cached (pushed to the
    host tier in between, where the engine can be asked to)."""
    cold = await spent.ask(client, body)
    if offload_path is not None:
        await client.offload(offload_path)
    return cold, await spent.ask(client, body)


async def _differential(
    ctx: ProbeContext, baseline: Baseline, body: dict[str, Any], spent: PromptTokens
) -> Checked:
    """Cold and warm on the canary and, at the same time, on the baseline.  A canary
    request that fails is the canary's failure (a TransportError, as anywhere); one of the
    baseline's only leaves this sample out of the baseline's rate."""
    theirs_spent = PromptTokens()  # the baseline's engines are not the ones under test
    ours, theirs = await asyncio.gather(
        _cold_then_warm(ctx.client, body, ctx.settings.offload_path, spent),
        _cold_then_warm(
            baseline.client, {**body, "model": baseline.model}, baseline.offload_path, theirs_spent
        ),
        return_exceptions=True,
    )
    if isinstance(ours, BaseException):
        raise ours
    if isinstance(theirs, TransportError):
        baseline_diverged = None
    elif isinstance(theirs, BaseException):
        raise theirs
    else:
        baseline_diverged = theirs[0].comparable != theirs[1].comparable
    cold, warm = ours
    judgement = VALID
    if cold.comparable != warm.comparable:
        judgement = Judgement(Outcome.DIVERGED, _first_difference(cold, warm))
    return Checked(judgement, warm, excerpt(cold), baseline_diverged)


def _first_difference(cold: ChatAnswer, warm: ChatAnswer) -> str:
    a, b = cold.comparable, warm.comparable
    at = next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )
    return f"warm answer differs from cold at char {at}: {a[at : at + 40]!r} vs {b[at : at + 40]!r}"
