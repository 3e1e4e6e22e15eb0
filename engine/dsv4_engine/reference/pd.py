"""Prefill → decode hand-over through the bootstrap room, as SGLang's P/D protocol runs it.

sglang-router (0.3.2, PD mode) sends every request to *both* servers at once, each on its
own route (`/v1/chat/completions`, ...), with `bootstrap_host`, `bootstrap_port` and a
random `bootstrap_room` added to the body.  In SGLang the prefill server prefills the
prompt and, once the decode server named by the same room has registered with its
bootstrap server, moves the prompt's KV to it; the prefill answers its own request only
after the transfer is done (`disaggregation/prefill.py`, the inflight queue:
`FINISH_LENGTH(length=0)` once the transfer polls Success), and the decode answers the
client.  The reference engines do the same over TCP, one connection per request:

- the prefill server's request handler prefills the prompt and files the result in its
  `Rooms` under the request's room, then waits (bounded) until a decode server has taken it;
- the decode server connects to `bootstrap_host:bootstrap_port`, names the room and the
  digest of the prompt it tokenized from its own copy of the body, and receives the first
  generated token, every paged segment of the prompt's pages (KV of every layer, index-K
  of the c4 layers), the compressors' open-block state and the prefill's cache counts.

One frame each way: a 4-byte big-endian header length, a JSON header, then the raw bytes
it lists.  Two checks make a hand-over fail loudly instead of importing the wrong bytes:
the room's prompt digest must be the decode's own (a room never serves another request's
pages), and the prefill side's `TransferFormat` must be the decode's (pages of another
index-K dtype, page size or build have another shape).  (The operator never pairs engines
of two formats: docs/rollout.md, paired promotion.)
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dsv4_engine.reference.engine import PrefilledState

CONNECT_TIMEOUT_S = 10.0
# How long either side waits for the other to reach the room: the router sends both
# requests at once, but a busy prefill server may start its prefill late (and a decode
# whose request failed never comes).  SGLang's own bound is its bootstrap timeout.
ROOM_TIMEOUT_S = 300.0
_LEN = struct.Struct(">I")


class TransferError(RuntimeError):
    """The prefill server could not be reached or did not deliver the room's pages."""


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


def prompt_digest(prompt: Sequence[int]) -> str:
    """The prompt's token ids as both servers tokenized them from their copies of one body."""
    return hashlib.sha256(json.dumps(list(prompt)).encode()).hexdigest()


def bootstrap_room(body: dict[str, Any]) -> int | None:
    """The request's room (an integer, as sglang-router sends it), or None."""
    room = body.get("bootstrap_room")
    return room if isinstance(room, int) and not isinstance(room, bool) else None


@dataclass
class _Room:
    digest: str
    state: asyncio.Future[PrefilledState] = field(default_factory=asyncio.Future)
    claimed: bool = False
    delivered: asyncio.Future[bool] = field(default_factory=asyncio.Future)
    """True once the pages were written to the decode, False when that write failed."""


class Rooms:
    """The prefill side's rooms: a request's prefill result, until its decode takes it.

    The prefill request and the decode's connection for one room may arrive in either
    order; whichever comes first waits for the other (bounded by ``timeout_s``)."""

    def __init__(self, timeout_s: float = ROOM_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._rooms: dict[int, _Room] = {}
        self._opened: dict[int, asyncio.Event] = {}

    def __len__(self) -> int:
        return len(self._rooms)

    def open(self, room: int, digest: str) -> None:
        """A prefill request for ``room`` has arrived (its prompt's ``digest``)."""
        if room in self._rooms:
            raise ValueError(f"bootstrap_room {room}: already in use by another request")
        self._rooms[room] = _Room(digest)
        self._opened.setdefault(room, asyncio.Event()).set()

    def fill(self, room: int, state: PrefilledState | None, error: str | None = None) -> None:
        """The room's prefill finished (``state``) or failed (``error``)."""
        slot = self._rooms[room].state
        if not slot.done():
            if error is not None:
                slot.set_exception(TransferError(error))
            else:
                assert state is not None
                slot.set_result(state)

    async def handed_over(self, room: int, timeout_s: float | None = None) -> str | None:
        """Wait until a decode server has received ``room``'s pages (or, for a room whose
        prefill failed, its error): None, or why not (nobody came within ``timeout_s``,
        default the rooms' own, or the write to it failed).  The room is closed either way."""
        wait = self.timeout_s if timeout_s is None else timeout_s
        try:
            sent = await asyncio.wait_for(asyncio.shield(self._rooms[room].delivered), wait)
        except TimeoutError:
            return f"no decode server took bootstrap_room {room} within {wait:g} s"
        finally:
            self.close(room)
        return None if sent else f"bootstrap_room {room}: the decode server went away mid-transfer"

    def delivered(self, room: int, sent: bool) -> None:
        """The claimed pages of ``room`` were written to its decode server (or not)."""
        entry = self._rooms.get(room)
        if entry is not None and not entry.delivered.done():
            entry.delivered.set_result(sent)

    def close(self, room: int) -> None:
        entry = self._rooms.pop(room, None)
        self._opened.pop(room, None)
        if entry is not None:
            for fut in (entry.state, entry.delivered):
                if not fut.done():
                    fut.cancel()

    async def take(self, room: int, digest: str) -> PrefilledState:
        """The decode side's claim on ``room``: its pages once prefilled.  Raises
        TransferError when the room never opens, fails, or holds another prompt."""
        opened = self._opened.setdefault(room, asyncio.Event())
        try:
            await asyncio.wait_for(opened.wait(), self.timeout_s)
        except TimeoutError:
            self._opened.pop(room, None)
            raise TransferError(
                f"bootstrap_room {room}: no prefill request arrived within {self.timeout_s:g} s"
            ) from None
        entry = self._rooms.get(room)
        if entry is None:
            raise TransferError(f"bootstrap_room {room}: closed before the decode arrived")
        if entry.digest != digest:
            raise TransferError(
                f"bootstrap_room {room}: the prefill request holds another prompt than this "
                "decode request (refused: its pages belong to another request)"
            )
        if entry.claimed:
            raise TransferError(f"bootstrap_room {room}: already claimed by another decode")
        entry.claimed = True
        try:
            return await asyncio.wait_for(asyncio.shield(entry.state), self.timeout_s)
        except TimeoutError:
            raise TransferError(
                f"bootstrap_room {room}: not prefilled within {self.timeout_s:g} s"
            ) from None
        except asyncio.CancelledError:
            raise TransferError(f"bootstrap_room {room}: closed by the prefill server") from None
        except TransferError:
            self.delivered(room, False)  # the prefill failed: nothing to hand over
            raise


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
    host: str, port: int, room: int, prompt: Sequence[int], fmt: TransferFormat
) -> PrefilledState:
    """The pages of ``room`` from the prefill server at host:port, for ``prompt``; refused
    (FormatMismatch) when they are laid out for another format than ``fmt``."""
    where = f"prefill server {host}:{port}"
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port), CONNECT_TIMEOUT_S
        )
    except (OSError, TimeoutError) as err:
        raise TransferError(f"{where}: cannot connect: {err}") from None
    try:
        await _write_frame(writer, {"room": room, "prompt": prompt_digest(prompt)}, [])
        header = await asyncio.wait_for(_read_header(reader), ROOM_TIMEOUT_S + CONNECT_TIMEOUT_S)
        if "error" in header:
            raise TransferError(f"{where}: {header['error']}")
        differs = fmt.mismatch(header.get("format") or {})
        if differs is not None:
            raise FormatMismatch(f"{where}: transfer format mismatch ({differs}); refused")
        return await asyncio.wait_for(read_state(reader, header), ROOM_TIMEOUT_S)
    except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as err:
        raise TransferError(f"{where}: transfer failed: {err!r}") from None
    finally:
        writer.close()


async def serve_bootstrap(
    host: str, port: int, rooms: Rooms, fmt: TransferFormat
) -> asyncio.AbstractServer:
    """The prefill side's bootstrap server: a decode server's connection names a room and
    receives its pages, with their format ``fmt``."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await _read_header(reader)
            room, digest = request.get("room"), request.get("prompt")
            if not isinstance(room, int) or not isinstance(digest, str):
                await _write_frame(writer, {"error": "expected a room and a prompt digest"}, [])
                return
            try:
                state = await rooms.take(room, digest)
            except TransferError as err:  # reported to the decode server, which answers 502
                await _write_frame(writer, {"error": str(err)}, [])
                return
            sent = False
            try:
                await _write_frame(writer, *encode_state(state, fmt))
                sent = True
            finally:
                rooms.delivered(room, sent)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            pass  # the decode side went away; it reports the failure to its client
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port)
