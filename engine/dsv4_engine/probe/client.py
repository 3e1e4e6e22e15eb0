"""The HTTP side of a probe: an OpenAI-compatible client that measures its own concurrency.

Why measure on the client: the seed's corruption needed 60+ requests in flight, so a run
that never got there proves nothing and must say so.  The meter counts requests between
send and full response, the peak and the time-weighted mean.

Every failure to get an answer is a `TransportError` with a one-line reason; the probe
records it as TRANSPORT_ERROR, never as corruption.

Each chat answer also says how many tokens its prompt was (`usage.prompt_tokens`; a
streamed answer sends its usage in a last chunk when asked with
``stream_options.include_usage``, as OpenAI's API and SGLang do, and sglang-router passes it
through): the probe's bound on how many samples read from the host tier rests on it
(`evidence.proven_exercised`).  What a prompt read from the host tier no answer through
sglang-router says (it drops ``return_cached_tokens_details``): the engines' own counters
do (`evidence`).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp

# A router's page of every engine's /metrics (sglang-router 0.3.2 serves it; so does the
# reference router): where the probe reads what the engines counted (`evidence`).
ENGINE_METRICS_PATH = "/engine_metrics"
ENGINE_OWN_METRICS_PATH = "/metrics"  # an engine's own page, probed without a router


class TransportError(Exception):
    """No answer to judge: connection refused, timeout, HTTP error or a malformed body."""


class EndpointMissing(TransportError):
    """HTTP 404/405: the engine does not implement this endpoint."""


@dataclass
class ConcurrencyMeter:
    in_flight: int = 0
    peak: int = 0
    _area: float = 0.0
    _last: float = field(default_factory=time.monotonic)
    _first: float | None = None

    def reset(self) -> None:
        """Forget what was measured so far (the preflight requests are not the probe)."""
        self.in_flight, self.peak, self._area, self._first = 0, 0, 0.0, None
        self._last = time.monotonic()

    def _advance(self) -> None:
        now = time.monotonic()
        self._area += self.in_flight * (now - self._last)
        self._last = now

    def enter(self) -> None:
        self._advance()
        if self._first is None:
            self._first = self._last
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)

    def leave(self) -> None:
        self._advance()
        self.in_flight -= 1

    @property
    def mean(self) -> float:
        """Time-weighted mean of requests in flight, from the first send to now."""
        if self._first is None:
            return 0.0
        self._advance()
        span = self._last - self._first
        return self._area / span if span > 0 else float(self.in_flight)


def prompt_tokens(reply: Any) -> int | None:
    """``usage.prompt_tokens`` of a reply, or None when it has none."""
    try:
        count = reply["usage"]["prompt_tokens"]
    except (TypeError, KeyError):
        return None
    return count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else None


@dataclass(frozen=True)
class ChatAnswer:
    message: dict[str, Any]
    finish_reason: str | None
    latency_s: float
    prompt_tokens: int | None = None
    """The prompt's size as the engine counted it (`prompt_tokens`); None: not reported."""
    streamed: bool = False
    """The answer came as server-sent deltas, joined here as an OpenAI client joins them."""

    @property
    def comparable(self) -> str:
        """Content plus tool calls, as one string: what cold and warm answers must share."""
        calls = [c.get("function") for c in self.message.get("tool_calls") or []]
        return json.dumps([self.message.get("content") or "", calls], sort_keys=True)


class EngineClient:
    def __init__(
        self,
        base_url: str,
        session: aiohttp.ClientSession,
        request_timeout_s: float,
        connect_timeout_s: float,
        api_key: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.session = session
        self.meter = ConcurrencyMeter()
        self._timeout = aiohttp.ClientTimeout(
            total=request_timeout_s, connect=connect_timeout_s, sock_connect=connect_timeout_s
        )
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    @contextlib.asynccontextmanager
    async def _exchange(
        self, method: str, path: str, body: Any, counted: bool = True
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """One request until its body is read — ``counted``: as a request in flight, by the
        meter — the response if it is HTTP 200; anything else is a `TransportError`."""
        url = self.base_url + path
        if counted:
            self.meter.enter()
        try:
            async with self.session.request(
                method, url, json=body, timeout=self._timeout, headers=self._headers
            ) as resp:
                if resp.status in (404, 405):
                    raise EndpointMissing(f"{method} {path}: HTTP {resp.status}")
                if resp.status != 200:
                    text = (await resp.read())[:200].decode("utf-8", "replace")
                    raise TransportError(f"{method} {path}: HTTP {resp.status}: {text}")
                yield resp
        except TimeoutError:
            raise TransportError(f"{method} {path}: timed out") from None
        except aiohttp.ClientError as err:
            raise TransportError(f"{method} {path}: {type(err).__name__}: {err}") from None
        finally:
            if counted:
                self.meter.leave()

    async def _request(self, method: str, path: str, body: Any = None) -> Any:
        """A JSON call, counted as a request in flight (`meter`)."""
        async with self._exchange(method, path, body) as resp:
            raw = await resp.read()
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise TransportError(f"{method} {path}: response is not JSON") from None

    async def models(self) -> list[str]:
        body = await self._request("GET", "/v1/models")
        try:
            return [m["id"] for m in body["data"]]
        except (TypeError, KeyError):
            raise TransportError("GET /v1/models: expected {'data': [{'id': ...}]}") from None

    async def server_info(self) -> dict[str, Any]:
        body = await self._request("GET", "/server_info")
        if not isinstance(body, dict):
            raise TransportError("GET /server_info: expected a JSON object")
        return body

    async def engine_metrics(self) -> str:
        """Every engine's Prometheus page through the router (sglang-router's
        ``GET /engine_metrics``), or, probing an engine itself, its own ``/metrics`` (not
        requests in flight)."""
        try:
            return await self._page(ENGINE_METRICS_PATH)
        except EndpointMissing:
            return await self._page(ENGINE_OWN_METRICS_PATH)

    async def _page(self, path: str) -> str:
        async with self._exchange("GET", path, None, counted=False) as resp:
            return (await resp.read()).decode("utf-8", "replace")

    async def offload(self, path: str) -> None:
        await self._request("POST", path, {})

    async def chat(self, body: dict[str, Any]) -> ChatAnswer:
        """The answer to a chat request; a streaming one (``body["stream"]``) is joined from
        its deltas (`joined`), then checked as an unstreamed answer is."""
        start = time.monotonic()
        if body.get("stream"):
            body = {**body, "stream_options": {"include_usage": True}}
            chunks = await self._events("POST", "/v1/chat/completions", body)
            reply = joined(chunks)
        else:
            reply = await self._request("POST", "/v1/chat/completions", body)
        latency = time.monotonic() - start
        try:
            choice = reply["choices"][0]
            message = choice["message"]
        except (TypeError, KeyError, IndexError):
            raise TransportError("POST /v1/chat/completions: no choices[0].message") from None
        if not isinstance(message, dict):
            raise TransportError("POST /v1/chat/completions: choices[0].message not an object")
        content, calls = message.get("content"), message.get("tool_calls")
        if not (content is None or isinstance(content, str)):
            raise TransportError("POST /v1/chat/completions: message.content not a string")
        if not (
            calls is None or (isinstance(calls, list) and all(isinstance(c, dict) for c in calls))
        ):
            raise TransportError(
                "POST /v1/chat/completions: message.tool_calls not a list of objects"
            )
        return ChatAnswer(
            message,
            choice.get("finish_reason"),
            latency,
            prompt_tokens(reply),
            bool(body.get("stream")),
        )

    async def _events(self, method: str, path: str, body: Any) -> list[Any]:
        """The JSON data of every server-sent event of a streaming answer, up to `[DONE]`."""
        chunks = []
        async with self._exchange(method, path, body) as resp:
            async for raw in resp.content:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue  # blank separators, `event:` names, comments
                data = line.removeprefix("data:").strip()
                if data == "[DONE]":
                    return chunks
                try:
                    chunks.append(json.loads(data))
                except ValueError:
                    raise TransportError(f"{method} {path}: an event is not JSON") from None
        raise TransportError(f"{method} {path}: the stream ended without [DONE]")


def joined(chunks: list[Any]) -> dict[str, Any]:
    """A streamed chat answer as one unstreamed reply: content deltas concatenated, each
    tool call's id, type and name from its first delta and its arguments from all of them
    (by `index`, as the OpenAI clients join them), the last finish_reason, and the `usage`
    (and SGLang's `sglext`) streamed in a last chunk of their own with no choices."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish: str | None = None
    reply: dict[str, Any] = {}
    try:
        for chunk in chunks:
            for key in ("usage", "sglext"):
                if chunk.get(key) is not None:
                    reply[key] = chunk[key]
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                content.append(delta.get("content") or "")
                for part in delta.get("tool_calls") or []:
                    call = calls.setdefault(
                        int(part["index"]),
                        {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                    )
                    call["id"] = call["id"] or part.get("id")
                    function = part.get("function") or {}
                    call["function"]["name"] += function.get("name") or ""
                    call["function"]["arguments"] += function.get("arguments") or ""
                finish = choice.get("finish_reason") or finish
    except (AttributeError, KeyError, TypeError, ValueError):
        raise TransportError("POST /v1/chat/completions: a stream chunk is malformed") from None
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return {**reply, "choices": [{"message": message, "finish_reason": finish}]}
