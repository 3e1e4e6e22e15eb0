"""The echo model's forward pass over the engine's paged pools (see the package docstring).

Layer by layer across the batch, in the order a DSV4 forward touches the pools:

0. sliding window: the previous token's row (the reader's and the controller's state),
   read behind the gate;
1. c4: the chunk's blocks compressed into entries; their index keys stored; then, at a
   trigger token, the schema lookups — the tool's name, the start, every parameter — by
   the indexer's top-1 over index-K; only then KV: entries stored, the chosen entries read;
2. c128: entries stored (the construction leaves this layer idle);
3. c4: the same entries and keys; at a trigger, each parameter's value looked up by the
   hash of its name read on layer 1; then the answer, one token per position, each copied
   token read at its position through the indexer (top-1) and the entry's KV;

and last the chunk's rows written to the sliding-window layer.  Every index-K access of a
layer precedes every KV access of it, for the whole batch, as in the random model: with
`DSV4_INJECT_UNGATED_INDEX_K` the lookups of a prefill that runs while its prefix loads
back from the host tier score the pages' previous keys.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields

import numpy as np
import torch

from dsv4_engine.pools.device_pool import DevicePool
from dsv4_engine.pools.layout import BufferKind, ModelShape
from dsv4_engine.reference.echo import parser, program
from dsv4_engine.reference.echo.codes import (
    ENTRY_DIMS,
    MAX_ENTRIES,
    Tag,
    entry_keys,
    entry_tag,
    entry_tags,
    entry_tokens,
    exact_tag_score,
    position_query,
    raw_c4_row,
    split16,
    tag_query,
)
from dsv4_engine.reference.echo.parser import ParseState
from dsv4_engine.reference.echo.program import MAX_PARAMS, Controller
from dsv4_engine.reference.model import Chunk

WINDOW, SCHEMA_LAYER, IDLE_LAYER, VALUE_LAYER = 0, 1, 2, 3
ECHO_SHAPE = ModelShape(
    compress_ratios=(0, 4, 128, 4), kv_dim=64, index_head_dim=128, index_n_heads=1, page_size=128
)
MAX_CONTEXT = 4 * MAX_ENTRIES  # positions must fit the position code (and two row slots)
_PARSE_WIDE = [f.name in parser.WIDE_FIELDS for f in fields(ParseState)]
_CTRL_WIDE = [False] * program.CONTROLLER_NARROW + [True] * program.CONTROLLER_WIDE
ROW_DIMS = 2 + sum(1 + w for w in _PARSE_WIDE) + sum(1 + w for w in _CTRL_WIDE)
_WEIGHT = torch.ones((1, 1))  # one indexer head, weight 1


def _pack(values: list[int], wide: list[bool]) -> list[int]:
    out: list[int] = []
    for value, w in zip(values, wide, strict=True):
        if w:
            out += (value >> 8, value & 0xFF)
        else:
            out.append(value)
    if min(out) < 0 or max(out) > 0xFF:
        raise ValueError(f"row values {values} do not fit their slots")
    return out


def pack_parse(token: int, state: ParseState) -> list[int]:
    """The first part of a token's row: the token and the reader's state after it."""
    return [*split16(token), *_packed_state(tuple(state.pack()))]


@functools.lru_cache(maxsize=4096)
def _packed_state(values: tuple[int, ...]) -> tuple[int, ...]:
    """Most tokens leave the reader's state as it was (prose, the answer): packed once."""
    return tuple(_pack(list(values), _PARSE_WIDE))


def pack_controller(ctrl: Controller) -> list[int]:
    """The rest of the row: the controller after choosing the next token."""
    if ctrl.phase == program.Phase.IDLE:
        return _IDLE
    return _pack(ctrl.pack(), _CTRL_WIDE)


_IDLE = _pack(Controller().pack(), _CTRL_WIDE)


def _field_slots() -> tuple[torch.Tensor, torch.Tensor]:
    """Row columns of each field's high and low byte (a one-slot field's high byte is a
    column every row leaves zero)."""
    high, low, at = [], [], 2
    for w in _PARSE_WIDE + _CTRL_WIDE:
        high.append(at if w else ROW_DIMS)
        low.append(at + 1 if w else at)
        at += 1 + w
    return torch.tensor(high), torch.tensor(low)


_HIGH, _LOW = _field_slots()
_PARSE_COUNT = len(_PARSE_WIDE)


def unpack_rows(rows: torch.Tensor) -> list[tuple[ParseState, Controller]]:
    """The reader's and the controller's state in rows [n, kv_dim] (read as float32)."""
    ints = rows.round().to(torch.int64)
    values = (ints[:, _HIGH] * 256 + ints[:, _LOW]).tolist()
    return [
        (ParseState.unpack(v[:_PARSE_COUNT]), Controller.unpack(v[_PARSE_COUNT:])) for v in values
    ]


def _rows(values: Sequence[Sequence[float]], width: int) -> torch.Tensor:
    """Rows [n, width] (float32) starting with `values`, zeros after.  Through numpy: a
    prefill batch has thousands of rows, and `torch.tensor` of nested lists is slower."""
    rows = torch.zeros((len(values), width))
    if values:
        rows[:, : len(values[0])] = torch.from_numpy(np.array(values, dtype=np.float32))
    return rows


@dataclass
class _Compressed:
    """One compressed layer's new entries for the whole batch, and what stays open."""

    locs: list[torch.Tensor] = field(default_factory=list)  # pool locations of the entries
    index: list[int] = field(default_factory=list)  # their entry numbers
    entries: list[torch.Tensor] = field(default_factory=list)  # [n, kv_dim] each
    whole: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # (slot, open rows)
    added: list[tuple[int, int, torch.Tensor]] = field(default_factory=list)  # (slot, at, row)

    def add(self, w: _Work, layer: int, first: int, entries: torch.Tensor) -> None:
        if len(entries):
            self.locs.append(w.chunk.locs[layer][first : first + len(entries)])
            self.index += range(first, first + len(entries))
            self.entries.append(entries)

    def keep(self, state: torch.Tensor) -> None:
        """Leave the open rows in the compress state: zeros past them, and a closed block
        leaves zeros, so equal contexts give equal bytes however they were computed."""
        for slot, rows in self.whole:
            state[slot] = 0.0
            state[slot, : len(rows)] = rows
        if self.added:
            slots, at, rows = zip(*self.added, strict=True)
            state[list(slots), list(at)] = torch.stack(rows)


@dataclass
class _Found:
    """What a trigger's lookups returned: pointers (positions) into the context."""

    tool: int  # the tool's name
    start: int  # the conversation's first token
    props: list[tuple[int, int]]  # each parameter found: (name hash, name start)
    params: list[tuple[int, int]] = field(default_factory=list)  # (name start, value start)


@dataclass
class _Work:
    """One request's chunk through the forward."""

    chunk: Chunk
    state: ParseState  # after the last token before the chunk
    ctrl: Controller
    rows: list[list[int]] = field(default_factory=list)  # each token's row, reader part
    at_trigger: dict[int, ParseState] = field(default_factory=dict)  # by chunk offset
    triggers: list[int] = field(default_factory=list)  # offsets in the chunk
    raw: torch.Tensor | None = None  # c4 raw rows of the chunk's tokens [T, kv_dim]
    found: dict[int, _Found] = field(default_factory=dict)  # by trigger offset


# A lookup stage of a c4 layer: issues its index-K queries now, returns the KV half to run
# once the layer's entries are stored (None: nothing to look up in this chunk).
_Lookups = Callable[[DevicePool, _Work, int], Callable[[], None] | None]
# A trigger's first indexer pass: the tool's name, the start, parameters 0..MAX_PARAMS-1.
_SCHEMA_QUERIES = torch.stack(
    [tag_query(Tag.TOOL_NAME, 0), tag_query(Tag.START, 0)]
    + [tag_query(Tag.SCHEMA_PROP, i) for i in range(MAX_PARAMS)]
)


class EchoModel:
    """Constructed weights that answer the tool-call echo prompt (see the package)."""

    def __init__(self, shape: ModelShape = ECHO_SHAPE) -> None:
        if shape.compress_ratios != ECHO_SHAPE.compress_ratios or shape.kv_dim <= ROW_DIMS:
            raise ValueError(
                f"the echo model is built for compress_ratios {ECHO_SHAPE.compress_ratios} "
                f"and kv_dim > {ROW_DIMS}"
            )
        self.shape = shape

    def forward(self, pool: DevicePool, chunks: list[Chunk]) -> list[int]:
        for c in chunks:
            if not c.locs:
                c.locs = {i: pool.entry_locs(i, c.pages) for i in range(self.shape.num_layers)}
        works = self._previous_rows(pool, chunks)
        raw: list[list[float]] = []
        for w in works:
            raw += self._read(w)
        rows = _rows(raw, self.shape.kv_dim)
        at = 0
        for w in works:
            w.raw, at = rows[at : at + len(w.chunk.tokens)], at + len(w.chunk.tokens)
        self._layer(pool, works, SCHEMA_LAYER, self._schema_lookups)
        self._layer(pool, works, IDLE_LAYER, None)
        self._layer(pool, works, VALUE_LAYER, self._value_lookups)
        outputs, state_rows = self._answers(pool, works)
        rows = _rows(state_rows, self.shape.kv_dim)
        locs = torch.cat([w.chunk.locs[WINDOW][w.chunk.start : w.chunk.end] for w in works])
        pool.store_kv(WINDOW, locs, rows)
        return outputs

    # -- layer 0 in: state ------------------------------------------------------------

    def _previous_rows(self, pool: DevicePool, chunks: list[Chunk]) -> list[_Work]:
        """The row of each chunk's previous token: a previous-token head of the window."""
        after = [c for c in chunks if c.start > 0]
        prev: dict[int, tuple[ParseState, Controller]] = {}
        if after:
            locs = torch.stack([c.locs[WINDOW][c.start - 1] for c in after])
            states = unpack_rows(pool.read_kv(WINDOW, locs).to(torch.float32))
            prev = {id(c): state for c, state in zip(after, states, strict=True)}
        return [_Work(c, *prev.get(id(c), (ParseState(), Controller()))) for c in chunks]

    @staticmethod
    def _read(w: _Work) -> list[list[float]]:
        """The reader over the chunk's tokens: tags and triggers (no pool access); returns
        the tokens' raw rows of the compressed layers."""
        state = w.state.copy()
        raw = []
        for offset, token in enumerate(w.chunk.tokens):
            pos = w.chunk.start + offset
            if pos >= MAX_CONTEXT:
                raise ValueError(f"the echo model reads at most {MAX_CONTEXT} tokens")
            tag, trigger = parser.step(state, token, pos)
            w.rows.append(pack_parse(token, state))
            if trigger:
                w.triggers.append(offset)
                w.at_trigger[offset] = state.copy()
            raw.append(raw_c4_row(token, pos, tag))
        return raw

    # -- compressed layers ------------------------------------------------------------

    def _layer(
        self, pool: DevicePool, works: list[_Work], layer: int, lookups: _Lookups | None
    ) -> None:
        """One compressed layer for the whole batch: its index keys first, then its lookups
        (index-K only), then KV — the entries stored and the lookups' entries read."""
        made = self._compress(pool, works, layer)
        entries = torch.cat(made.entries) if made.entries else None
        locs = torch.cat(made.locs) if made.locs else None
        if lookups is not None:
            if entries is not None:
                keys = entry_keys(torch.tensor(made.index), entry_tags(entries))
                pool.store_index_k(layer, locs, keys)
            reads = [read for w in works if (read := lookups(pool, w, layer)) is not None]
        if entries is not None:
            pool.store_kv(layer, locs, entries)
        made.keep(pool.buffer(layer, BufferKind.COMPRESS_STATE))
        if lookups is not None:
            for read in reads:
                read()

    def _compress(self, pool: DevicePool, works: list[_Work], layer: int) -> _Compressed:
        """The batch's new entries: the mean of each block's rows (the compressor's softmax
        gate with zero weights).  Rows of a block opened by an earlier step come from the
        compress state, read behind the gate — never in a page-aligned prefill chunk, the
        one that races a load.  Decode steps (one token each) are done together."""
        ratio = self.shape.compress_ratios[layer]
        made = _Compressed()
        steps = []
        for w in works:
            assert w.raw is not None
            c = w.chunk
            if len(c.tokens) == 1:
                steps.append(w)
                continue
            pending = c.start % ratio
            held = pool.read_compress_state(layer, c.slot)[:pending] if pending else w.raw[:0]
            rows = torch.cat([held, w.raw])
            closed = (len(rows) // ratio) * ratio
            made.add(
                w, layer, c.start // ratio, rows[:closed].view(-1, ratio, rows.shape[1]).mean(1)
            )
            made.whole.append((c.slot, rows[closed:]))
        closing = [w for w in steps if w.chunk.start % ratio == ratio - 1]
        if closing:
            slots = torch.tensor([w.chunk.slot for w in closing])
            held = pool.buffer(layer, BufferKind.COMPRESS_STATE)[slots, : ratio - 1]
            new = torch.cat([w.raw for w in closing if w.raw is not None])[:, None]
            for w, entry in zip(closing, torch.cat([held, new], dim=1).mean(1), strict=True):
                made.add(w, layer, w.chunk.start // ratio, entry[None])
                made.whole.append((w.chunk.slot, new[:0, 0]))
        for w in steps:
            if w.chunk.start % ratio != ratio - 1 and w.raw is not None:
                made.added.append((w.chunk.slot, w.chunk.start % ratio, w.raw[0]))
        return made

    def _lookup(
        self, pool: DevicePool, w: _Work, layer: int, at: int, queries: torch.Tensor
    ) -> tuple[torch.Tensor, list[float]]:
        """The indexer's top-1 of each query [n, 128] among the entries complete at chunk
        offset `at`: (entry locations [n], their scores)."""
        visible = (w.chunk.start + at + 1) // 4
        locs = w.chunk.locs[layer][:visible]
        if visible == 0:
            return locs[:0], []
        scores = pool.index_scores(
            layer, locs, queries[:, None, :], _WEIGHT.expand(len(queries), 1)
        )
        best = pool.ops.topk(scores, 1)[:, 0]
        return locs[best], scores.gather(1, best[:, None])[:, 0].tolist()

    def _read_entries(self, pool: DevicePool, layer: int, locs: torch.Tensor) -> list[list[float]]:
        if len(locs) == 0:
            return []
        return pool.read_kv(layer, locs).to(torch.float32)[:, :ENTRY_DIMS].tolist()

    def _schema_lookups(self, pool: DevicePool, w: _Work, layer: int) -> Callable[[], None] | None:
        """At each trigger: where the tool's name, the start and the parameters are."""
        if not w.triggers:
            return None
        picks = {t: self._lookup(pool, w, layer, t, _SCHEMA_QUERIES) for t in w.triggers}

        def read() -> None:
            exact = exact_tag_score(with_turn=False) - 0.5
            for t, (locs, scores) in picks.items():
                tags = [entry_tag(e) for e in self._read_entries(pool, layer, locs)]
                if not tags:  # nothing indexed yet
                    w.found[t] = _Found(0, 0, [])
                    continue
                props = []
                for tag, score in zip(tags[2:], scores[2:], strict=True):
                    if score < exact:
                        break
                    props.append((tag[3], tag[4]))
                # The tool and the start are taken wherever the top-1 points: the answer
                # needs them, and the context had a tool (the reader saw its schema).
                w.found[t] = _Found(tool=tags[0][3], start=tags[1][3], props=props)

        return read

    def _value_lookups(self, pool: DevicePool, w: _Work, layer: int) -> Callable[[], None] | None:
        """At each trigger: where this turn's value of every parameter found starts."""
        if not w.triggers:
            return None
        picks = {}
        for t in w.triggers:
            props, turn = w.found[t].props, w.at_trigger[t].turn
            if props:
                queries = torch.stack([tag_query(Tag.INSTR_VALUE, h, turn) for h, _ in props])
                picks[t] = self._lookup(pool, w, layer, t, queries)

        def read() -> None:
            exact = exact_tag_score(with_turn=True) - 0.5
            for t, (locs, scores) in picks.items():
                tags = [entry_tag(e) for e in self._read_entries(pool, layer, locs)]
                found = w.found[t]
                found.params = [
                    (name, tag[3])
                    for (_, name), tag, score in zip(found.props, tags, scores, strict=True)
                    if score >= exact
                ]

        return read

    # -- the answer -------------------------------------------------------------------

    def _answers(self, pool: DevicePool, works: list[_Work]) -> tuple[list[int], list[list[int]]]:
        """The controller over every chunk, token offset by token offset across the batch:
        each token's choice of the next one (the last token's is the chunk's answer), and
        each token's row, chunk after chunk.  An answer runs from its trigger to the end of
        the turn (end of sentence, or a new user turn); a context without a tool schema gets
        the conversation recited.

        The copy heads of one offset that need an entry they do not hold look it up
        together, one indexer pass and one KV read for the batch (`_copy_entries`): a
        decode step of many requests reads the pools once, not once per request.  A choice
        that needed one is replayed from where it began, now holding the entry; a choice
        reads at most one position, so the replay reads only the entry it looked up."""
        ctrls = [w.ctrl for w in works]
        answers = [parser.EOS] * len(works)
        rows: list[list[list[int]]] = [[] for _ in works]
        for offset in range(max(len(w.chunk.tokens) for w in works)):
            live = [i for i, w in enumerate(works) if offset < len(w.chunk.tokens)]
            for i in live:
                ctrls[i] = _enter(works[i], offset, ctrls[i])
            empty: dict[int, int] = {}  # request -> an entry with nothing indexed to read
            todo = [i for i in live if ctrls[i].phase != program.Phase.IDLE]
            for i in live:
                answers[i] = parser.EOS
            while todo:
                misses: list[tuple[int, int]] = []
                for i in todo:
                    ctrl, before = ctrls[i], ctrls[i].pack()
                    try:
                        answers[i] = program.choose(
                            ctrl, functools.partial(_held_token, ctrl, empty.get(i))
                        )
                    except _Miss as miss:
                        ctrls[i] = Controller.unpack(before)
                        misses.append((i, miss.entry))
                found = self._copy_entries(pool, [(works[i], offset, e) for i, e in misses])
                for (i, entry), tokens in zip(misses, found, strict=True):
                    if tokens is None:
                        empty[i] = entry
                    else:
                        ctrls[i].held_entry, ctrls[i].held = entry + 1, tokens
                todo = [i for i, _ in misses]
            for i in live:
                rows[i].append(works[i].rows[offset] + pack_controller(ctrls[i]))
        return answers, [row for chunk_rows in rows for row in chunk_rows]

    def _copy_entries(
        self, pool: DevicePool, wanted: list[tuple[_Work, int, int]]
    ) -> list[list[int] | None]:
        """The copy head for a batch of (chunk, offset, entry): each entry's four tokens,
        read through the indexer's top-1 of the entry's position code among the entries its
        request had complete at that offset, then that entry's KV (None: none complete).

        One scoring pass over every request's entries; a query's scores outside its own
        request's entries are masked, so each top-1 is the one its request alone would get
        (the scores are exact sums of 0/1 codes, and ties go to the lower index)."""
        seen = [w.chunk.locs[VALUE_LAYER][: (w.chunk.start + at + 1) // 4] for w, at, _ in wanted]
        asked = [k for k, locs in enumerate(seen) if len(locs)]
        out: list[list[int] | None] = [None] * len(wanted)
        if not asked:
            return out
        locs = torch.cat([seen[k] for k in asked])
        queries = torch.stack([position_query(wanted[k][2]) for k in asked])
        scores = pool.index_scores(
            VALUE_LAYER, locs, queries[:, None, :], _WEIGHT.expand(len(asked), 1)
        )
        owner = torch.repeat_interleave(torch.tensor([len(seen[k]) for k in asked]))
        scores = scores.masked_fill(owner[None, :] != torch.arange(len(asked))[:, None], -math.inf)
        best = locs[pool.ops.topk(scores, 1)[:, 0]]
        for k, row in zip(asked, self._read_entries(pool, VALUE_LAYER, best), strict=True):
            out[k] = entry_tokens(row)
        return out


class _Miss(Exception):
    """The copy head needs an entry it does not hold (looked up for the batch at once)."""

    def __init__(self, entry: int) -> None:
        super().__init__(entry)
        self.entry = entry


def _held_token(ctrl: Controller, empty: int | None, pos: int) -> int:
    """The token at `pos` from the entry the copy head holds; EOS where nothing was indexed
    yet (`empty`); otherwise `_Miss`."""
    entry = min(max(pos, 0) // 4, MAX_ENTRIES - 1)
    if ctrl.held_entry == entry + 1:
        return ctrl.held[max(pos, 0) % 4]
    if entry == empty:
        return parser.EOS
    raise _Miss(entry)


def _enter(w: _Work, offset: int, ctrl: Controller) -> Controller:
    """The controller as token `offset` of the chunk enters it: set by the trigger's
    lookups, reset by the end of a turn, else as the previous token left it."""
    if offset in w.found:
        found = w.found[offset]
        tool = found.tool if w.at_trigger[offset].tools_seen else None
        return program.begin(tool, found.params, found.start)
    if w.chunk.tokens[offset] in (parser.EOS, parser.USER):
        return Controller()
    return ctrl
