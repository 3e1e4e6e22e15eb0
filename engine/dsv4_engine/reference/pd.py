"""Prefill → decode transfer over TCP: the prompt's KV and index-K pages, byte for byte.

The decode server connects to the prefill server's bootstrap port (SGLang's
`--disaggregation-bootstrap-port`), sends the prompt's token ids and receives the first
generated token, every paged segment of the prompt's pages (KV of every layer, index-K of
the c4 layers) and the compressors' open-block state.  One frame each way:
4-byte big-endian header length, a JSON header, then the raw bytes it lists.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from dsv4_engine.reference.engine import PrefilledState

CONNECT_TIMEOUT_S = 10.0
PREFILL_TIMEOUT_S = 300.0
_LEN = struct.Struct(">I")


class TransferError(RuntimeError):
    """The prefill server could not be reached or did not deliver the pages."""


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


def encode_state(state: PrefilledState) -> tuple[dict[str, Any], list[bytes]]:
    pages = [{"layer": layer, "kind": kind, "bytes": len(data)}
             for (layer, kind), data in state.pages.items()]  # fmt: skip
    states = [{"layer": layer, "bytes": len(data)} for layer, data in state.compress_state.items()]
    blobs = list(state.pages.values()) + list(state.compress_state.values())
    return {"first_token": state.first_token, "pages": pages, "states": states}, blobs


async def read_state(reader: asyncio.StreamReader, header: dict[str, Any]) -> PrefilledState:
    pages = {}
    for entry in header["pages"]:
        pages[(int(entry["layer"]), str(entry["kind"]))] = await reader.readexactly(entry["bytes"])
    states = {}
    for entry in header["states"]:
        states[int(entry["layer"])] = await reader.readexactly(entry["bytes"])
    return PrefilledState(int(header["first_token"]), pages, states)


async def fetch_prefill(host: str, port: int, prompt: list[int]) -> PrefilledState:
    """Ask the prefill server at host:port to prefill `prompt`; its pages and first token."""
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
        return await asyncio.wait_for(read_state(reader, header), PREFILL_TIMEOUT_S)
    except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as err:
        raise TransferError(f"{where}: transfer failed: {err!r}") from None
    finally:
        writer.close()


Prefill = Callable[[list[int]], Awaitable[PrefilledState]]


async def serve_bootstrap(host: str, port: int, prefill: Prefill) -> asyncio.AbstractServer:
    """The prefill side: one connection per request, prefilled by `prefill`."""

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
            await _write_frame(writer, *encode_state(state))
        except (OSError, asyncio.IncompleteReadError, ValueError):
            pass  # the decode side went away; it reports the failure to its client
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port)
