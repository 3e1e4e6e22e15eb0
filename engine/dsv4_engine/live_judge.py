"""Every tool-call answer an engine serves, judged by the project's validator off the
response path, and counted per revision and role.

What is judged: each chat completion whose request offered ``tools``, as the user receives
it (the message the tool-call parser built: ``content``, ``reasoning_content``,
``tool_calls``, and the choice's ``finish_reason``), with
`dsv4_engine.probe.validate.classify_chat_message` and no echo (nobody knows what the user
asked for), the request's messages and tools as its context.  The DSML format is the one
the engine's tool-call parser reads (`format_of_parser`).

Outcomes (`OUTCOMES`, the ``outcome`` label): ``VALID``; each corruption class of
`Outcome`; ``DSML_IN_CONTENT`` — the parser returned no tool call and left DSML markup in
``content`` (sglang#35736, sglang#40236: a block the validator alone would read as a call,
but the user got text); ``TRUNCATED`` — stopped by ``max_tokens`` (finish_reason
``length``) before anything else went wrong: counted apart, not corruption; ``skipped`` —
the bounded queue was full (the judge fell behind): counted when it happens, never dropped
silently.

How: the serving code calls `LiveJudge.submit`, which only puts the answer on a bounded
queue (`QUEUE_SIZE`) and returns; one worker thread judges and counts.  Judging never
delays or changes an answer.  Nothing of an answer is logged or kept, unless the operator
of the engine asks for examples (`EXAMPLES_ENV`): then the last few corrupt answers are
kept *redacted* (`redact`) in a small ring buffer.

Switches: `SWITCH_ENV` (``off`` disables judging: nothing is queued or counted),
`REVISION_ENV` (the ``revision`` label, set by the operator on engine pods; "" unset).
"""

from __future__ import annotations

import logging
import os
import queue
import re
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dsv4_engine.engine_config import REVISION_ENV
from dsv4_engine.probe.context import RequestContext
from dsv4_engine.probe.dsml import markup_in
from dsv4_engine.probe.dsml_format import MARKER, DsmlFormat
from dsv4_engine.probe.outcome import VALIDATOR_OUTCOMES, Outcome
from dsv4_engine.probe.tools import tool_validators
from dsv4_engine.probe.validate import classify_chat_message

log = logging.getLogger(__name__)

METRIC = "dsv4_engine_tool_call_answers_total"
METRIC_HELP = (
    "Chat completions that offered tools, as served, judged by the project's validator "
    "(no echo), by outcome: VALID, a corruption class, DSML_IN_CONTENT, TRUNCATED "
    "(max_tokens, not corruption) or skipped (the judge's queue was full)."
)
TOKENS_METRIC = "dsv4_engine_tool_call_output_tokens"
TOKENS_HELP = "Completion tokens of the tool-call answers judged (skipped ones not)."
LABELS = ("revision", "role", "outcome")
TOKENS_LABELS = ("revision", "role")
TOKEN_BUCKETS: tuple[float, ...] = (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)

SWITCH_ENV = "DSV4_LIVE_JUDGE"
"""``off`` (or 0/false/no): no answer is judged or counted; anything else: on (default)."""
EXAMPLES_ENV = "DSV4_LIVE_JUDGE_EXAMPLES"
"""How many redacted corrupt examples to keep (default 0: none; at most `MAX_EXAMPLES`)."""
MAX_EXAMPLES = 100
QUEUE_SIZE = 1024
YIELD_S = 1e-4
"""The worker sleeps this long after each answer: the GIL is free then, so a serving thread
that wants it takes it.  Without a pause a thread waiting for the GIL waits out the
interpreter's switch interval (5 ms) while a burst of answers is judged, since the worker
takes the GIL straight back (a 0-second sleep does not hand it over reliably)."""

DSML_IN_CONTENT = "DSML_IN_CONTENT"
SKIPPED = "skipped"
TRUNCATED = Outcome.TRUNCATED.value
OUTCOMES: tuple[str, ...] = (
    *(o.value for o in VALIDATOR_OUTCOMES),
    DSML_IN_CONTENT,
    SKIPPED,
)
NOT_CORRUPTION = frozenset({Outcome.VALID.value, TRUNCATED, SKIPPED})

PARSER_FORMATS: dict[str, DsmlFormat] = {
    "deepseekv4": DsmlFormat.V4,
    "deepseekv41": DsmlFormat.V41,
    "deepseekv32": DsmlFormat.V32,
}
# Outcomes a cut-off answer shows because it was cut: its block ended early, or held no
# call yet.  With finish_reason `length` they are TRUNCATED; a loop or markup in the
# reasoning stays what it is (a loop that ran into max_tokens is a loop).
_CUT_SHOWS = frozenset(
    {
        Outcome.VALID.value,
        TRUNCATED,
        Outcome.SCHEMA.value,
        Outcome.UNBALANCED.value,
        DSML_IN_CONTENT,
    }
)


def format_of_parser(tool_call_parser: str | None) -> DsmlFormat | None:
    """The DSML format an engine's tool-call parser reads; None: not a DeepSeek parser."""
    return PARSER_FORMATS.get(tool_call_parser or "")


def enabled(env: Mapping[str, str] | None = None) -> bool:
    value = (os.environ if env is None else env).get(SWITCH_ENV, "on").strip().lower()
    return value not in ("off", "0", "false", "no")


def revision(env: Mapping[str, str] | None = None) -> str:
    return (os.environ if env is None else env).get(REVISION_ENV, "")


def examples_kept(env: Mapping[str, str] | None = None) -> int:
    value = (os.environ if env is None else env).get(EXAMPLES_ENV, "0").strip()
    try:
        return max(0, min(MAX_EXAMPLES, int(value or 0)))
    except ValueError:
        raise ValueError(f"{EXAMPLES_ENV}={value!r}: expected a count 0..{MAX_EXAMPLES}") from None


def offers_tools(tools: Sequence[Any] | None, tool_choice: Any = None) -> bool:
    """Whether a chat request offered tools: some, and not ``tool_choice: none`` (then the
    prompt renders none and no parser runs: SGLang's `_tool_call_parsing_active`)."""
    return bool(tools) and tool_choice != "none"


@dataclass(frozen=True)
class Answer:
    """One served chat answer to judge: the choice's message and finish_reason, the
    request's tools and messages, and the choice's completion tokens (None: unknown).
    The message, tools and messages may be SGLang's pydantic objects: they are turned into
    plain dicts by the worker (`plain`), not on the response path."""

    message: Any
    finish_reason: str | None
    tools: Sequence[Any]
    messages: Sequence[Any] | None = None
    completion_tokens: int | None = None


def plain(value: Any) -> Any:
    """A pydantic model (or a list of them) as the JSON-shaped dict a client would see."""
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    dump = getattr(value, "model_dump", None)
    return dump(exclude_none=True) if dump is not None else value


def judge(answer: Answer, fmt: DsmlFormat) -> tuple[str, str]:
    """(outcome label, detail) of one answer: the validator's class, DSML_IN_CONTENT for
    markup the parser left in content instead of calls, TRUNCATED for an answer cut by
    max_tokens that shows nothing worse than being cut."""
    message, tools = plain(answer.message), plain(answer.tools)
    try:
        validators = tool_validators(tools)
    except ValueError:  # a schema the validator cannot compile: judge without schemas
        validators = None
    context = RequestContext.of(plain(answer.messages), tools, None)
    judgement = classify_chat_message(message, answer.finish_reason, fmt, validators, None, context)
    outcome, detail = judgement.outcome.value, judgement.detail
    content = message.get("content") or ""
    if (
        not message.get("tool_calls")
        and outcome != Outcome.DEGENERATE_TEXT.value
        and (why := markup_in(content, fmt)) is not None
        and not markup_in(message.get("reasoning_content") or "", fmt)
    ):
        outcome, detail = DSML_IN_CONTENT, f"no tool_calls; {why} left in content"
    if answer.finish_reason == "length" and outcome in _CUT_SHOWS:
        return TRUNCATED, f"finish_reason length, {outcome}: {detail}".removesuffix(": ")
    return outcome, detail


_KEEP = re.compile(rf"{re.escape(MARKER)}\s?/?[a-z_]*|</?think>|<\|?[A-Za-z_]+\|?>")
_ALNUM = re.compile(r"[^\W_]")
EXAMPLE_CHARS = 160


def redact(text: str, limit: int = EXAMPLE_CHARS) -> str:
    """The shape of ``text``, not its words: its first ``limit`` characters with every
    letter masked as ``x`` and every digit as ``0`` (any script), markup tokens (the DSML
    marker and tag name, think tags) and punctuation kept, so a loop, a leak or a broken
    block stays visible while no name, number or sentence of the user survives."""
    head, out, pos = text[:limit], [], 0
    for kept in _KEEP.finditer(head):
        out.append(_mask(head[pos : kept.start()]))
        out.append(kept.group())
        pos = kept.end()
    out.append(_mask(head[pos:]))
    return "".join(out) + ("…" if len(text) > limit else "")


def _mask(text: str) -> str:
    return _ALNUM.sub(lambda m: "0" if m.group().isdigit() else "x", text)


@dataclass
class Tally:
    """What was counted, by outcome, with the completion tokens of judged answers
    (histogram: counts per `TOKEN_BUCKETS` bucket, cumulative in `render`)."""

    outcomes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    bucket_counts: list[int] = field(default_factory=lambda: [0] * (len(TOKEN_BUCKETS) + 1))
    tokens_sum: int = 0
    tokens_count: int = 0

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def observe(self, tokens: int) -> None:
        i = next((i for i, le in enumerate(TOKEN_BUCKETS) if tokens <= le), len(TOKEN_BUCKETS))
        self.bucket_counts[i] += 1
        self.tokens_sum += tokens
        self.tokens_count += 1


Submitted = Answer | Callable[[], Sequence[Answer]]
"""An answer, or a function the worker calls for the answers to judge (e.g. parsing the
chunks of a stream off the response path)."""
Sink = Callable[[str, int | None], None]
"""Told each counted outcome (and a judged answer's completion tokens, else None)."""


class LiveJudge:
    """A bounded queue and one worker thread that judges what `submit` hands it.

    `tally` always holds the counts; ``sink`` (e.g. prometheus_client counters) is told
    each count as well.  ``examples`` > 0 keeps that many redacted corrupt examples."""

    def __init__(
        self,
        fmt: DsmlFormat,
        *,
        revision: str = "",
        role: str = "unified",
        queue_size: int = QUEUE_SIZE,
        examples: int = 0,
        sink: Sink | None = None,
        judge_fn: Callable[[Answer, DsmlFormat], tuple[str, str]] = judge,
    ) -> None:
        self.fmt = fmt
        self.revision = revision
        self.role = role
        self.tally = Tally()
        self.examples: deque[dict[str, Any]] = deque(maxlen=max(0, examples))
        self._keep_examples = examples > 0
        self._sink = sink
        self._judge = judge_fn
        self._queue: queue.Queue[Submitted | None] = queue.Queue(maxsize=queue_size)
        self._lock = threading.Lock()
        self._worker = threading.Thread(target=self._run, name="dsv4-live-judge", daemon=True)
        self._worker.start()

    def submit(self, answer: Submitted) -> None:
        """Queue ``answer`` for judging and return at once; a full queue counts `SKIPPED`
        (one per answer: a function's answers are not known yet, and count as one)."""
        try:
            self._queue.put_nowait(answer)
        except queue.Full:
            self._count(SKIPPED, None)

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait until every queued answer is judged (tests, benchmarks); False on timeout."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.001)
        return True

    def stop(self) -> None:
        self._queue.put(None)
        self._worker.join(timeout=10)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self.tally.outcomes)

    def _run(self) -> None:
        while True:
            answer = self._queue.get()
            try:
                if answer is None:
                    return
                for one in [answer] if isinstance(answer, Answer) else answer():
                    self._judge_one(one)
                    # Let the serving threads have the GIL between answers (see YIELD_S).
                    time.sleep(YIELD_S)
            except Exception as err:  # a judge bug must not end judging (nor touch an answer)
                where = traceback.extract_tb(err.__traceback__)[-1]
                log.error(
                    "live judge: judging an answer failed: %s at %s:%s (its message is not "
                    "logged: it may quote the answer)",
                    type(err).__name__, where.filename, where.lineno,
                )  # fmt: skip
            finally:
                self._queue.task_done()

    def _judge_one(self, answer: Answer) -> None:
        outcome, detail = self._judge(answer, self.fmt)
        self._count(outcome, answer.completion_tokens)
        if self._keep_examples and outcome not in NOT_CORRUPTION:
            self._keep(answer, outcome, detail)

    def _count(self, outcome: str, tokens: int | None) -> None:
        with self._lock:
            self.tally.count(outcome)
            if tokens is not None and outcome != SKIPPED:
                self.tally.observe(tokens)
        if self._sink is not None:
            self._sink(outcome, tokens if outcome != SKIPPED else None)

    def _keep(self, answer: Answer, outcome: str, detail: str) -> None:
        message = plain(answer.message)
        example = {
            "outcome": outcome,
            "detail": redact(detail, 120),
            "finish_reason": answer.finish_reason,
            "completion_tokens": answer.completion_tokens,
            "content_chars": len(message.get("content") or ""),
            "reasoning_chars": len(message.get("reasoning_content") or ""),
            "tool_calls": len(message.get("tool_calls") or ()),
            "content_shape": redact(message.get("content") or ""),
        }
        with self._lock:
            self.examples.append(example)
        log.warning("live judge: %s", example)

    def recent_examples(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.examples)


def render(judge: LiveJudge) -> list[str]:
    """The two families in Prometheus text format, every outcome shown (0 included)."""
    with judge._lock:
        tally = Tally(dict(judge.tally.outcomes), list(judge.tally.bucket_counts),
                      judge.tally.tokens_sum, judge.tally.tokens_count)  # fmt: skip
    base = f'revision="{_escape(judge.revision)}",role="{_escape(judge.role)}"'
    out = [f"# HELP {METRIC} {METRIC_HELP}", f"# TYPE {METRIC} counter"]
    out += [f'{METRIC}{{{base},outcome="{o}"}} {n}' for o, n in tally.outcomes.items()]
    name = TOKENS_METRIC
    out += [f"# HELP {name} {TOKENS_HELP}", f"# TYPE {name} histogram"]
    cumulative = 0
    for le, n in zip((*TOKEN_BUCKETS, "+Inf"), tally.bucket_counts, strict=True):
        cumulative += n
        bound = le if isinstance(le, str) else f"{float(le)}"
        out.append(f'{name}_bucket{{{base},le="{bound}"}} {cumulative}')
    out.append(f"{name}_sum{{{base}}} {tally.tokens_sum}")
    out.append(f"{name}_count{{{base}}} {tally.tokens_count}")
    return out


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class StreamedMessage:
    """The message a client joins from streamed chat deltas (OpenAI's rule): ``content``
    and ``reasoning_content`` pieces concatenated, each tool call's pieces merged by their
    ``index`` (the first names it, the next extend its arguments), the last
    ``finish_reason`` seen."""

    def __init__(self) -> None:
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None

    def add_choice(self, choice: Mapping[str, Any]) -> None:
        delta = choice.get("delta") or {}
        if content := delta.get("content"):
            self._content.append(content)
        if reasoning := delta.get("reasoning_content"):
            self._reasoning.append(reasoning)
        for piece in delta.get("tool_calls") or ():
            call = self._calls.setdefault(
                piece.get("index", len(self._calls)),
                {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
            )
            if piece.get("id"):
                call["id"] = piece["id"]
            function = piece.get("function") or {}
            if function.get("name"):
                call["function"]["name"] += function["name"]
            if function.get("arguments"):
                call["function"]["arguments"] += function["arguments"]
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self._content)}
        if self._reasoning:
            message["reasoning_content"] = "".join(self._reasoning)
        if self._calls:
            message["tool_calls"] = [self._calls[i] for i in sorted(self._calls)]
        return message
