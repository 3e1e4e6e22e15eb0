"""SGLang's served tool-call answers, judged live (`dsv4_engine.live_judge`), counted on the
engine's /metrics.

Where: SGLang 0.5.23 builds the OpenAI answer in ``OpenAIServingChat`` (entrypoints/openai/
serving_chat.py), in the HTTP server's process, around its tool-call parsing
(``--tool-call-parser deepseekv4 | deepseekv41``: the deepseek-recipe output adapter,
``_encoding_output().parse_chat_response`` / ``stream_chat_chunks``; other parsers
``_process_tool_calls`` / ``_process_tool_call_stream``).  Four hooks, through SGLang's
HookRegistry like the plugin's others (and, like them, one that cannot apply stops the
engine):

* AFTER ``__init__`` (`start`): the serving object exists, so the server's tool-call
  parser (the DSML format judged), its disaggregation role and its metrics directory are
  known (SGLang sets ``PROMETHEUS_MULTIPROC_DIR`` before it builds its tokenizer manager,
  the plugin loads before that: the counters are made here, never at plugin load).  Every
  outcome is exported at 0 from here on, so ``rate()`` and ``increase()`` see the first.
* AFTER ``_build_chat_response`` (`judge_response`): the non-streamed answer, returned
  untouched; its choices (pydantic objects, turned into dicts by the judge's worker) are
  queued with the request's tools and messages and each choice's completion tokens.
* AROUND ``_generate_chat_stream`` (`judge_stream`): re-yields every SSE chunk unchanged
  and keeps a reference to each; at the end of the stream the chunks are queued and the
  worker joins each choice's deltas into the message the client joins
  (`live_judge.StreamedMessage`).  A stream the client left, or that ended in an error,
  delivered no answer and is not judged.
* AROUND ``_generate_stream_content`` (`note_stream_tokens`): hands the stream's
  completion-token counts (SGLang's dict, per choice) to `judge_stream`, which has no
  other way to learn them without parsing a chunk on the response path.

Only the server whose answer the user receives judges.  In P/D mode the router sends each
request to both servers and gives the user the decode server's answer; SGLang's prefill
server runs each request with ``max_new_tokens = 1`` (disaggregation/prefill.py
``_process_req``) and its answer carries no generated text for the user.  So a server
with ``--disaggregation-mode prefill`` judges nothing and exports no family
(`start`); ``role`` is SGLang's ``engine_type`` (``decode`` or ``unified``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from dsv4_engine import live_judge

log = logging.getLogger(__name__)

SERVING = "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat"
INIT_TARGET = f"{SERVING}.__init__"
RESPONSE_TARGET = f"{SERVING}._build_chat_response"
STREAM_TARGET = f"{SERVING}._generate_chat_stream"
CONTENT_TARGET = f"{SERVING}._generate_stream_content"

_judge: live_judge.LiveJudge | None = None
# A stream's completion-token counts (SGLang's dict, by choice index), by id(request), set
# by `note_stream_tokens` while `judge_stream` runs that request's stream.
_stream_tokens: dict[int, dict[int, int] | None] = {}


def current() -> live_judge.LiveJudge | None:
    return _judge


def start(result: Any, serving: Any, *_: Any, **__: Any) -> None:
    """AFTER hook of ``OpenAIServingChat.__init__``: this process's judge, once."""
    global _judge
    if _judge is not None or not live_judge.enabled():
        return
    from sglang.srt.disaggregation.utils import DisaggregationMode

    mode = getattr(serving.tokenizer_manager, "disaggregation_mode", None)
    role = DisaggregationMode.to_engine_type(getattr(mode, "value", mode))
    fmt = live_judge.format_of_parser(getattr(serving, "tool_call_parser", None))
    if role == "prefill" or fmt is None:
        return
    _judge = live_judge.LiveJudge(
        fmt,
        revision=live_judge.revision(),
        role=role,
        examples=live_judge.examples_kept(),
        sink=_prometheus_sink(live_judge.revision(), role),
    )


def _prometheus_sink(revision: str, role: str) -> live_judge.Sink:
    """Counters in prometheus_client's registry (which SGLang's multiprocess /metrics
    collects, as the kv-canary counter), every outcome at 0."""
    from prometheus_client import REGISTRY, Counter, Histogram

    registry = REGISTRY
    answers = Counter(
        live_judge.METRIC.removesuffix("_total"),
        live_judge.METRIC_HELP,
        live_judge.LABELS,
        registry=registry,
    )
    tokens = Histogram(
        live_judge.TOKENS_METRIC,
        live_judge.TOKENS_HELP,
        live_judge.TOKENS_LABELS,
        buckets=live_judge.TOKEN_BUCKETS,
        registry=registry,
    )
    by_outcome = {o: answers.labels(revision, role, o) for o in live_judge.OUTCOMES}
    lengths = tokens.labels(revision, role)

    def sink(outcome: str, completion_tokens: int | None) -> None:
        by_outcome[outcome].inc()
        if completion_tokens is not None:
            lengths.observe(completion_tokens)

    return sink


def _offered(request: Any) -> bool:
    return live_judge.offers_tools(
        getattr(request, "tools", None), getattr(request, "tool_choice", None)
    )


def judge_response(result: Any, serving: Any, request: Any, ret: Any, *_: Any, **__: Any) -> Any:
    """AFTER hook of ``_build_chat_response``: queue each choice; the answer is returned
    as SGLang built it (an error response has no choices and is not judged)."""
    judge = _judge
    if judge is None or not _offered(request) or not hasattr(result, "choices"):
        return result
    for choice in result.choices:
        meta = ret[choice.index]["meta_info"] if choice.index < len(ret) else {}
        judge.submit(
            live_judge.Answer(
                choice.message,
                choice.finish_reason,
                request.tools,
                request.messages,
                meta.get("completion_tokens"),
            )
        )
    return result


async def judge_stream(
    original: Callable[..., AsyncIterator[str]], serving: Any, *args: Any, **kwargs: Any
) -> AsyncIterator[str]:
    """AROUND hook of ``_generate_chat_stream``: every chunk passes unchanged; at the end
    the chunks go to the judge's queue, parsed there."""
    request = kwargs.get("request", args[1] if len(args) > 1 else None)
    judge = _judge
    if judge is None or not _offered(request):
        async for chunk in original(serving, *args, **kwargs):
            yield chunk
        return
    key = id(request)
    _stream_tokens[key] = None
    chunks: list[str] = []
    try:
        async for chunk in original(serving, *args, **kwargs):
            chunks.append(chunk)
            yield chunk
        tokens = dict(_stream_tokens.get(key) or {})
    finally:
        _stream_tokens.pop(key, None)
    judge.submit(lambda: _streamed_answers(chunks, request, tokens))


def note_stream_tokens(
    original: Callable[..., Any], serving: Any, *args: Any, **kwargs: Any
) -> Any:
    """AROUND hook of ``_generate_stream_content``: note the stream's completion-token
    counts for `judge_stream` (the dict itself: SGLang updates it with every output)."""
    request = kwargs.get("request")
    if request is not None and id(request) in _stream_tokens:
        _stream_tokens[id(request)] = kwargs.get("completion_tokens")
    return original(serving, *args, **kwargs)


def _streamed_answers(chunks: list[str], request: Any, tokens: dict[int, int]) -> list[Any]:
    """Each choice's answer, as the client joins it from the stream's chunks (run by the
    judge's worker).  A stream with an error chunk, or a choice without a finish_reason,
    delivered no whole answer: nothing to judge."""
    joined: dict[int, live_judge.StreamedMessage] = {}
    for chunk in chunks:
        for line in chunk.splitlines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            body = json.loads(line.removeprefix("data: "))
            if "error" in body:
                return []
            for choice in body.get("choices") or ():
                joined.setdefault(choice.get("index", 0), live_judge.StreamedMessage())
                joined[choice.get("index", 0)].add_choice(choice)
    return [
        live_judge.Answer(
            message.message(),
            message.finish_reason,
            request.tools,
            request.messages,
            tokens.get(index),
        )
        for index, message in sorted(joined.items())
        if message.finish_reason is not None
    ]
