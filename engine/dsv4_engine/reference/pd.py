"""Prefill → decode transfer over TCP: the prompt's KV and index-K pages, byte for byte.

The decode server connects to the prefill server's bootstrap port (SGLang's
`--disaggregation-bootstrap-port`), sends the prompt's token ids and receives the first
generated token, every paged segment of the prompt's pages (KV of every layer, index-K of
the c4 layers) and the compressors' open-block state.  One frame each way:
4-byte big-endian header length, a JSON header, then the raw bytes it lists.

The pages are only meaningful to an engine that lays them out the same way, so the
answer carries the prefill side's `TransferFormat` and the decode side refuses one that
differs from its own — the way a real transfer between engines of different index-K
dtypes or builds fails, but loudly and counted, instead of importing bytes of another
shape.  (The operator never pairs such engines: docs/rollout.md, paired promotion.)
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from dsv4_engine.reference.engine import PrefilledState

CONNECT_TIMEOUT_S = 10.0
PREFILL_TIMEOUT_S = 300.0
_LEN = struct.Struct(">I")


class TransferError(RuntimeError):
    """The prefill server could not be reached or did not deliver the pages."""


class FormatMismatch(TransferError):
    """The prefill server's pages are laid out for another format than this engine's."""


@dataclass(frozen=True)
class TransferFormat:
    """What both ends of a transfer must agree on for its bytes to mean the same."""

    index_dtype: str  # index-K rows: fp8 132 B, fp4 68 B, bf16 256 B per key
    kv_dtype: str  # KV rows
    page_size: int  # tokens per page: how the rows are grouped
    build: str  # the engine build that wrote them (another version may lay pages out anew)

    def mismatch(self, theirs: dict[str, Any]) -> str | None:
        """What differs between this (decode) format and the prefill side's, or None."""
        ours = dataclasses.asdict(self)
        diffs = [f"{k}: prefill {theirs.get(k)!r}, decode {v!r}" for k, v in ours.items()
                 if theirs.get(k) != v]  # fmt: skip
        return "; ".join(diffs) or None


async def _write_frame(
    writer: asyncio.StreamWriter, header: dict[str, Any], blobs: list[bytes]
) -> None:
    head = json.dumps(header).encode()
    writer.write(_LEN.pack(len(head)) + head)
    for blob in blobs:
        writer.write(blob)
    await writer.drain()


async def _read_header(reader: asyncio.StreamReader) -> dict[str, Any]:
    (size,) = _LEN.unpack(await reader.readexactly(_LEN.size))
    return json.loads(await reader.readexactly(size))


def encode_state(state: PrefilledState, fmt: TransferFormat) -> tuple[dict[str, Any], list[bytes]]:
    pages = [{"layer": layer, "kind": kind, "bytes": len(data)}
             for (layer, kind), data in state.pages.items()]  # fmt: skip
    states = [{"layer": layer, "bytes": len(data)} for layer, data in state.compress_state.items()]
    blobs = list(state.pages.values()) + list(state.compress_state.values())
    header = {
        "first_token": state.first_token,
        "pages": pages,
        "states": states,
        "cached_tokens": state.cached_tokens,
        "host_tokens": state.host_tokens,
    }
    return {**header, "format": dataclasses.asdict(fmt)}, blobs


async def read_state(reader: asyncio.StreamReader, header: dict[str, Any]) -> PrefilledState:
    pages = {}
    for entry in header["pages"]:
        pages[(int(entry["layer"]), str(entry["kind"]))] = await reader.readexactly(entry["bytes"])
    states = {}
    for entry in header["states"]:
        states[int(entry["layer"])] = await reader.readexactly(entry["bytes"])
    cached, host = int(header["cached_tokens"]), int(header["host_tokens"])
    return PrefilledState(int(header["first_token"]), pages, states, cached, host)


async def fetch_prefill(
    host: str, port: int, prompt: list[int], fmt: TransferFormat
) -> PrefilledState:
    """Ask the prefill server at host:port to prefill `prompt`; its pages and first token,
    refused (FormatMismatch) when they are laid out for another format than ``fmt``."""
    where = f"prefill server {host}:{port}"
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port), CONNECT_TIMEOUT_S
        )
    except (OSError, TimeoutError) as err:
        raise TransferError(f"{where}: cannot connect: {err}") from None
    try:
        await _write_frame(writer, {"prompt": prompt}, [])
        header = await asyncio.wait_for(_read_header(reader), PREFILL_TIMEOUT_S)
        if "error" in header:
            raise TransferError(f"{where}: {header['error']}")
        differs = fmt.mismatch(header.get("format") or {})
        if differs is not None:
            raise FormatMismatch(f"{where}: transfer format mismatch ({differs}); refused")
        return await asyncio.wait_for(read_state(reader, header), PREFILL_TIMEOUT_S)
    except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as err:
        raise TransferError(f"{where}: transfer failed: {err!r}") from None
    finally:
        writer.close()


Prefill = Callable[[list[int]], Awaitable[PrefilledState]]


async def serve_bootstrap(
    host: str, port: int, prefill: Prefill, fmt: TransferFormat
) -> asyncio.AbstractServer:
    """The prefill side: one connection per request, prefilled by `prefill`, its pages sent
    with their format ``fmt``."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await _read_header(reader)
            prompt = request.get("prompt")
            if not isinstance(prompt, list) or not prompt:
                await _write_frame(writer, {"error": "prompt: expected token ids"}, [])
                return
            try:
                state = await prefill([int(t) for t in prompt])
            except Exception as err:  # reported to the decode server, which answers 502
                await _write_frame(writer, {"error": f"prefill failed: {err}"}, [])
                return
            await _write_frame(writer, *encode_state(state, fmt))
        except (OSError, asyncio.IncompleteReadError, ValueError):
            pass  # the decode side went away; it reports the failure to its client
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port)
