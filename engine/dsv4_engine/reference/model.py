"""A tiny DeepSeek-V4-shaped model with seeded random weights, over the real paged pools.

Layer mix as in DSV4: sliding-window layers (ratio 0), c4 layers whose compressor folds 4
tokens into one KV entry and whose lightning indexer picks the top-k compressed entries
each token attends to, and c128 layers attending to every compressed entry.  Compressed
layers also attend to the raw tokens of their current, not yet compressed block (kept in
the pool's compress state between steps).

Why the order inside a c4 layer matters: the indexer stores and scores index-K first and
only then touches KV, exactly as a real forward pass does.  The KV accessor waits at the
layer gate; with `DSV4_INJECT_UNGATED_INDEX_K=1` the index-K accessor does not, so the
indexer can read keys a HiCache load has not delivered yet — the seed incident.  The
indexer scores through the pool (`index_scores`, straight from the pages; a decode batch
too, row by row, each over its own entries) and selects with the pool's top-k, so the
kernels the engine ships (torch or Triton) are the ones it runs.

Determinism: a request's answer depends on nothing but its own tokens, in float32,
single-threaded.  Prefill chunks compute on the request's own tensors and end on page
boundaries, so a request that finds its first pages in the prefix cache computes the
remaining chunks with exactly the shapes (and bytes read from the pools) of a cold run:
warm == cold bit for bit.  One-token chunks (every decode step) run as one batch of rows
whose ops compute each row on shapes of its own (`reference.rows`): the same bytes in a
batch of 1 or of 64.  Their arithmetic is not the unbatched engine's (a one-row GEMM per
row instead of a `[1, h]` matmul, attention over fixed widths), so a decode token may round
differently from what that engine computed; the consistency probe compares this engine
with itself (warm vs cold, batch vs batch), where every path is the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from dsv4_engine.pools.device_pool import DevicePool
from dsv4_engine.pools.layout import INDEXED_RATIO, ModelShape
from dsv4_engine.reference import rows, tokenizer

# DSV4's layer mix, tiny: sliding window, c4 (indexed), c128, c4 (indexed).  fp8 index-K
# needs a head dim that is a multiple of 128, so the index head keeps its real size.
REFERENCE_SHAPE = ModelShape(
    compress_ratios=(0, 4, 128, 4), kv_dim=32, index_head_dim=128, index_n_heads=4, page_size=128
)
# Greedy decoding picks among printable ASCII and newline: answers are readable UTF-8.
ALLOWED_OUTPUT = [10, *range(32, 127)]


@dataclass(frozen=True)
class ModelConfig:
    shape: ModelShape = REFERENCE_SHAPE
    hidden: int = 64
    mlp_hidden: int = 128
    window: int = 128
    index_topk: int = 16
    seed: int = 0


@dataclass
class Chunk:
    """One step of one request: `tokens` at positions start.. on the request's pages."""

    tokens: list[int]
    start: int
    pages: list[int]
    slot: int
    locs: dict[int, torch.Tensor] = field(default_factory=dict)
    runner_up: bool = False
    """Take the second-best token (`ServeSettings.benign_nondeterminism`)."""

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


@dataclass
class _Layer:
    wq: torch.Tensor
    wkv: torch.Tensor
    wo: torch.Tensor
    w1: torch.Tensor
    w2: torch.Tensor
    gate: torch.Tensor | None = None  # compressor: score of each raw token in its block
    gate_bias: torch.Tensor | None = None
    wik: torch.Tensor | None = None  # indexer: keys from compressed entries
    wiq: torch.Tensor | None = None  # indexer: per-head queries
    wiw: torch.Tensor | None = None  # indexer: per-head weights
    w_in: torch.Tensor | None = None
    """[wq | wkv | wiq | wiw]: the rows path projects a token's input with one GEMM."""


@dataclass
class _Staged:
    """A compressed layer between its indexer phase and its attention phase."""

    q: torch.Tensor
    raw: torch.Tensor  # raw tokens of the open block(s), from the block start
    entries: torch.Tensor  # new compressed entries [last - first, d]
    first: int
    last: int
    seen: torch.Tensor  # entries complete at each token of the chunk
    chosen: tuple[torch.Tensor, torch.Tensor] | None  # indexer's (top-k ids, visible)


@dataclass
class _Rows:
    """A forward's one-token chunks, computed as one batch: a row per chunk."""

    chunks: list[Chunk]
    x: torch.Tensor  # [B, hidden]
    pos: torch.Tensor  # [B] the token's position
    slots: torch.Tensor  # [B] compress-state slots
    runner_up: torch.Tensor  # [B] bool
    _locs: dict[int, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def of(cls, chunks: list[Chunk], embed: torch.Tensor) -> _Rows:
        return cls(
            chunks,
            embed[torch.tensor([c.tokens[0] for c in chunks], dtype=torch.int64)],
            torch.tensor([c.start for c in chunks], dtype=torch.int64),
            torch.tensor([c.slot for c in chunks], dtype=torch.int64),
            torch.tensor([c.runner_up for c in chunks], dtype=torch.bool),
        )

    def locs(
        self, layer: int, entries: torch.Tensor, which: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Pool locations of layer `layer`'s entries [B, n] of rows `which` (None: all), an
        entry index per row within the row's own pages (the padding past them never read)."""
        if layer not in self._locs:
            own = [c.locs[layer] for c in self.chunks]
            self._locs[layer] = torch.nn.utils.rnn.pad_sequence(own, batch_first=True)
        table = self._locs[layer] if which is None else self._locs[layer][which]
        return torch.gather(table, 1, entries)


@dataclass
class _StagedRows:
    """`_Staged` for rows: a compressed layer between its indexer and attention phases."""

    q: torch.Tensor  # [B, d]
    raw: torch.Tensor  # [B, ratio, d] each row's open block, its token included
    raw_visible: torch.Tensor  # [B, ratio]
    entry: torch.Tensor  # [B, d] the entry of the block this token closes (where `closes`)
    closes: torch.Tensor  # [B] bool
    new_loc: torch.Tensor  # [B] where that entry goes
    last: torch.Tensor  # [B] entries complete, this token's included
    chosen: tuple[torch.Tensor, torch.Tensor] | None  # indexer's (top-k ids, visible)


class ReferenceModel:
    def __init__(self, config: ModelConfig) -> None:
        self.config = config
        self.shape = shape = config.shape
        gen = torch.Generator().manual_seed(config.seed)
        h, d = config.hidden, shape.kv_dim

        def w(*size: int, gain: float = 1.0) -> torch.Tensor:
            return torch.randn(size, generator=gen) * (gain / math.sqrt(size[0]))

        # Bytes and special tokens first, the markup pieces (which this model never writes)
        # last: the weights it computes with stay those drawn before the pieces existed,
        # so what the race was measured to do to its answers holds (growing the vocabulary had
        # shifted every draw).
        embed = torch.randn((tokenizer.PIECES_AT, h), generator=gen)
        self.layers: list[_Layer] = []
        for ratio in shape.compress_ratios:
            layer = _Layer(
                w(h, d, gain=2.0),
                w(h, d),
                w(d, h),
                w(h, config.mlp_hidden),
                w(config.mlp_hidden, h),
            )
            if ratio:
                layer.gate, layer.gate_bias = w(d), torch.randn(ratio, generator=gen)
            if ratio == INDEXED_RATIO:
                hi, di = shape.index_n_heads, shape.index_head_dim
                layer.wik, layer.wiq = w(d, di), w(h, hi * di)
                layer.wiw = w(h, hi)
            inputs = (layer.wq, layer.wkv, layer.wiq, layer.wiw)
            layer.w_in = torch.cat([t for t in inputs if t is not None], dim=1)
            self.layers.append(layer)
        unembed = w(h, tokenizer.PIECES_AT, gain=4.0)
        pieces = tokenizer.VOCAB_SIZE - tokenizer.PIECES_AT
        self.embed = torch.cat([embed, torch.randn((pieces, h), generator=gen)])
        self.unembed = torch.cat([unembed, torch.zeros((h, pieces))], dim=1)
        self.allowed = torch.full((tokenizer.VOCAB_SIZE,), float("-inf"))
        self.allowed[ALLOWED_OUTPUT] = 0.0

    def forward(self, pool: DevicePool, chunks: list[Chunk]) -> list[int]:
        """Run one chunk per request, layer by layer across the batch; greedy next tokens.

        Layer-major like a batched GPU forward: every request passes layer L before any
        passes L+1, so all of a batch's indexer reads race the same in-flight loads.  Chunks
        of several tokens (prefill) compute on their own tensors; one-token chunks (decode
        steps, and a prompt's one-token last chunk) compute as one batch of rows
        (`reference.rows`), which a chunk's length alone decides, never its batch.
        """
        for c in chunks:
            if not c.locs:
                c.locs = {i: pool.entry_locs(i, c.pages) for i in range(len(self.layers))}
        many = [c for c in chunks if len(c.tokens) > 1]
        xs = [self.embed[torch.tensor(c.tokens)] for c in many]
        one = _Rows.of([c for c in chunks if len(c.tokens) == 1], self.embed)
        for i, layer in enumerate(self.layers):
            ratio = self.config.shape.compress_ratios[i]
            hs = [_rms(x) for x in xs]
            h1 = _rms(one.x) if one.chunks else one.x
            if ratio:
                # The whole batch's compressor and indexer run before any attention (one
                # kernel each on a GPU): every indexer read precedes every KV read.
                staged = [
                    self._compress(pool, i, ratio, layer, c, h)
                    for c, h in zip(many, hs, strict=True)
                ]
                staged1 = (
                    self._compress_rows(pool, i, ratio, layer, one, h1) if one.chunks else None
                )
                atts = [
                    self._attend_compressed(pool, i, ratio, c, st)
                    for c, st in zip(many, staged, strict=True)
                ]
                att1 = None
                if staged1 is not None:
                    att1 = self._attend_compressed_rows(pool, i, ratio, one, staged1)
            else:
                atts = [self._window(pool, i, layer, c, h) for c, h in zip(many, hs, strict=True)]
                att1 = self._window_rows(pool, i, layer, one, h1) if one.chunks else None
            for n, att in enumerate(atts):
                x = xs[n] + att @ layer.wo
                xs[n] = x + torch.relu(_rms(x) @ layer.w1) @ layer.w2
            if att1 is not None:
                x1 = one.x + rows.project(att1, layer.wo)
                one.x = x1 + rows.project(torch.relu(rows.project(_rms(x1), layer.w1)), layer.w2)
        best: dict[int, int] = {}
        for c, x in zip(many, xs, strict=True):
            logits = _rms(x[-1:]) @ self.unembed + self.allowed
            top = torch.topk(logits[0], 2).indices[1] if c.runner_up else torch.argmax(logits[0])
            best[id(c)] = int(top)
        if one.chunks:
            logits = rows.project(_rms(one.x), self.unembed) + self.allowed
            seconds = torch.topk(logits, 2, dim=1).indices[:, 1]
            tops = torch.where(one.runner_up, seconds, torch.argmax(logits, dim=1))
            best.update(zip(map(id, one.chunks), tops.tolist(), strict=True))
        return [best[id(c)] for c in chunks]

    def _window(
        self, pool: DevicePool, i: int, layer: _Layer, c: Chunk, h: torch.Tensor
    ) -> torch.Tensor:
        q, kv = h @ layer.wq, h @ layer.wkv
        locs = c.locs[i]
        pool.store_kv(i, locs[c.start : c.end], kv)
        lo = max(0, c.start - self.config.window + 1)
        ctx = pool.read_kv(i, locs[lo : c.end]).to(torch.float32)
        pos = torch.arange(c.start, c.end)[:, None]
        ctx_pos = torch.arange(lo, c.end)[None, :]
        visible = (ctx_pos <= pos) & (ctx_pos > pos - self.config.window)
        return _attend(q, [(ctx, visible)])

    def _compress(
        self, pool: DevicePool, i: int, ratio: int, layer: _Layer, c: Chunk, h: torch.Tensor
    ) -> _Staged:
        """Compressor (new entries of the chunk's full blocks) and, on c4, the indexer."""
        assert layer.gate is not None and layer.gate_bias is not None
        q, kv = h @ layer.wq, h @ layer.wkv
        pending = c.start % ratio
        # Compress state, like KV, is read behind the gate: only when a block is open.
        state = pool.read_compress_state(i, c.slot)[:pending] if pending else kv[:0]
        raw = torch.cat([state, kv])  # raw tokens from the start of the current block
        first, last = c.start // ratio, c.end // ratio  # new entries: [first, last)
        blocks = raw[: (last - first) * ratio].view(-1, ratio, raw.shape[1])
        weights = torch.softmax(blocks @ layer.gate + layer.gate_bias, dim=1)
        entries = (weights[..., None] * blocks).sum(1)
        seen = (torch.arange(c.start, c.end) + 1) // ratio  # entries complete at each token
        chosen = None
        if ratio == INDEXED_RATIO:
            chosen = self._index(pool, i, layer, c.locs[i], first, last, entries, h, seen)
        return _Staged(q, raw, entries, first, last, seen, chosen)

    def _attend_compressed(
        self, pool: DevicePool, i: int, ratio: int, c: Chunk, st: _Staged
    ) -> torch.Tensor:
        locs = c.locs[i]
        if st.last > st.first:
            pool.store_kv(i, locs[st.first : st.last], st.entries)
        ent = pool.read_kv(i, locs[: st.last]).to(torch.float32)
        if st.chosen is None:
            ent_ctx, ent_vis = ent, torch.arange(st.last)[None, :] < st.seen[:, None]
        else:
            idx, ent_vis = st.chosen
            ent_ctx = ent[idx]
        pos = torch.arange(c.start, c.end)
        closed = (st.last - st.first) * ratio
        pool.store_compress_state(i, c.slot, _pad(st.raw[closed:], ratio))
        # Raw tokens of each token's own block, up to itself (from the block's start).
        raw_pos = torch.arange(c.start - c.start % ratio, c.end)[None, :]
        raw_vis = (raw_pos <= pos[:, None]) & (raw_pos >= (pos // ratio * ratio)[:, None])
        return _attend(st.q, [(ent_ctx, ent_vis), (st.raw, raw_vis)])

    def _index(
        self,
        pool: DevicePool,
        i: int,
        layer: _Layer,
        locs: torch.Tensor,
        first: int,
        last: int,
        entries: torch.Tensor,
        h: torch.Tensor,
        seen: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The lightning indexer: (top-k entry ids [T, k], which of them are visible)."""
        assert layer.wik is not None and layer.wiq is not None and layer.wiw is not None
        shape = self.config.shape
        if last > first:
            pool.store_index_k(i, locs[first:last], entries @ layer.wik)
        if last == 0:  # fewer tokens than one block: nothing to index yet
            return torch.zeros((len(seen), 0), dtype=torch.int64), torch.zeros(
                (len(seen), 0), dtype=torch.bool
            )
        tokens = len(seen)
        iq = (h @ layer.wiq).view(tokens, shape.index_n_heads, shape.index_head_dim)
        scores = pool.index_scores(i, locs[:last], iq, h @ layer.wiw)
        visible = torch.arange(last)[None, :] < seen[:, None]
        scores = scores.masked_fill(~visible, float("-inf"))
        idx = pool.ops.topk(scores, min(self.config.index_topk, last))
        return idx, torch.gather(visible, 1, idx)

    # -- one-token chunks, as one batch of rows ----------------------------------------------

    def _window_rows(
        self, pool: DevicePool, i: int, layer: _Layer, one: _Rows, h: torch.Tensor
    ) -> torch.Tensor:
        """Sliding window: each row attends to a fixed `window` of positions (the ones
        before its first token hidden), so its width is never the batch's."""
        q, kv = self._inputs(layer, h)[:2]
        pool.store_kv(i, one.locs(i, one.pos[:, None])[:, 0], kv)
        width = self.config.window
        ctx_pos = one.pos[:, None] - (width - 1) + torch.arange(width)
        visible = ctx_pos >= 0
        locs = one.locs(i, ctx_pos.clamp(min=0))
        ctx = pool.read_kv(i, locs.flatten()).view(len(one.chunks), width, -1)
        return rows.attend(q, [(ctx.to(torch.float32), visible)])

    def _compress_rows(
        self, pool: DevicePool, i: int, ratio: int, layer: _Layer, one: _Rows, h: torch.Tensor
    ) -> _StagedRows:
        """Compressor and, on c4, indexer of one token per row (see `_compress`)."""
        assert layer.gate is not None and layer.gate_bias is not None
        q, kv, *index_inputs = self._inputs(layer, h)
        count = len(one.chunks)
        pending = one.pos % ratio  # tokens of the open block before this one
        opened = torch.arange(ratio)[None, :] < pending[:, None]
        # As `_compress`: the state is read (behind the gate) only when a block is open.
        if bool(pending.any()):
            state = pool.read_compress_state(i, one.slots)
            raw = torch.where(opened[..., None], state, 0.0)
        else:
            raw = kv.new_zeros((count, ratio, kv.shape[1]))
        raw[torch.arange(count), pending] = kv
        closes = pending == ratio - 1
        last = (one.pos + 1) // ratio  # entries complete once this token is in
        # The closing block's entry (computed for every row, kept where a block closes).
        weights = torch.softmax((raw * layer.gate).sum(-1) + layer.gate_bias, dim=1)
        entry = (weights[..., None] * raw).sum(1)
        new_loc = one.locs(i, (last - 1).clamp(min=0)[:, None])[:, 0]
        chosen = None
        if ratio == INDEXED_RATIO:
            iq, iw = index_inputs
            stored = (entry[closes], new_loc[closes])
            chosen = self._index_rows(pool, i, layer, one, iq, iw, stored, last)
        # Raw tokens each row attends to: its open block, up to itself.
        raw_visible = torch.arange(ratio)[None, :] <= pending[:, None]
        return _StagedRows(q, raw, raw_visible, entry, closes, new_loc, last, chosen)

    def _index_rows(
        self,
        pool: DevicePool,
        i: int,
        layer: _Layer,
        one: _Rows,
        iq: torch.Tensor,
        iw: torch.Tensor,
        stored: tuple[torch.Tensor, torch.Tensor],
        last: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The lightning indexer of one token per row: (top-k entry ids [B, k], visible).

        Each row scores its own entries through the pool (the kernels the engine ships);
        every row then picks exactly `index_topk`, a row with fewer entries its hidden
        padding too, so the width attention sees is the same for every row."""
        assert layer.wik is not None
        entries, locs = stored  # the entries this step closes, and where they go
        if len(entries):
            pool.store_index_k(i, locs, rows.project(entries, layer.wik))
        count, k = len(one.chunks), self.config.index_topk
        counts = last.tolist()
        scores = torch.full((count, max(k, *counts)), float("-inf"))
        for n, (c, seen) in enumerate(zip(one.chunks, counts, strict=True)):
            if seen:
                row = slice(n, n + 1)
                scores[n, :seen] = pool.index_scores(i, c.locs[i][:seen], iq[row], iw[row])[0]
        idx = pool.ops.topk(scores, k)
        return idx, idx < last[:, None]

    def _attend_compressed_rows(
        self, pool: DevicePool, i: int, ratio: int, one: _Rows, st: _StagedRows
    ) -> torch.Tensor:
        if bool(st.closes.any()):
            pool.store_kv(i, st.new_loc[st.closes], st.entry[st.closes])
        dim = self.config.shape.kv_dim
        if st.chosen is not None:
            idx, visible = st.chosen
            locs = one.locs(i, torch.where(visible, idx, 0))
            ent = pool.read_kv(i, locs.flatten()).view(*idx.shape, dim).to(torch.float32)
            # Hidden picks may be pages never written (garbage, maybe NaN): zero them.
            ent = ent.masked_fill(~visible[..., None], 0.0)
            att = rows.attend(st.q, [(ent, visible), (st.raw, st.raw_visible)])
        else:
            # Every entry: a width of the row's own, so rows are grouped by their count.
            counts = st.last.tolist()
            groups = sorted(set(counts))
            if len(groups) == 1:
                att = self._attend_every_entry(pool, i, one, st, None, groups[0])
            else:
                att = torch.empty_like(st.q)
                for seen in groups:
                    which = (st.last == seen).nonzero()[:, 0]
                    att[which] = self._attend_every_entry(pool, i, one, st, which, seen)
        state = torch.where(st.closes[:, None, None], 0.0, st.raw)
        pool.store_compress_state(i, one.slots, state)
        return att

    def _attend_every_entry(
        self,
        pool: DevicePool,
        i: int,
        one: _Rows,
        st: _StagedRows,
        which: torch.Tensor | None,
        seen: int,
    ) -> torch.Tensor:
        """Attention of rows `which` (None: all), each with `seen` entries, over all of them
        (a layer without an indexer) and their open block."""
        parts = (st.q, st.raw, st.raw_visible)
        q, raw, raw_visible = parts if which is None else (t[which] for t in parts)
        ids = torch.arange(seen).expand(len(q), seen)
        ent = pool.read_kv(i, one.locs(i, ids, which).flatten()).view(len(q), seen, raw.shape[2])
        visible = torch.ones((len(q), seen), dtype=torch.bool)
        return rows.attend(q, [(ent.to(torch.float32), visible), (raw, raw_visible)])

    def _inputs(self, layer: _Layer, h: torch.Tensor) -> list[torch.Tensor]:
        """The rows' q, kv (and, on an indexed layer, indexer queries [B, H, d] and head
        weights [B, H]) from their normed inputs h, in one GEMM per row."""
        assert layer.w_in is not None
        shape = self.config.shape
        d = shape.kv_dim
        out = rows.project(h, layer.w_in)
        q, kv = out[:, :d], out[:, d : 2 * d]
        if layer.wiq is None:
            return [q, kv]
        heads, hd = shape.index_n_heads, shape.index_head_dim
        iq = out[:, 2 * d : 2 * d + heads * hd].reshape(len(h), heads, hd)
        return [q, kv, iq, out[:, 2 * d + heads * hd :]]


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def _pad(rows: torch.Tensor, n: int) -> torch.Tensor:
    return torch.cat([rows, rows.new_zeros((n - rows.shape[0], rows.shape[1]))])


def _attend(q: torch.Tensor, parts: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Attention of q [T, d] over context parts (keys = values, an MLA-style latent).

    A part is (ctx [C, d] shared by every token, or [T, k, d] per token; visible [T, C]).
    """
    scores = [
        q @ ctx.T if ctx.dim() == 2 else torch.einsum("td,tkd->tk", q, ctx) for ctx, _ in parts
    ]
    out = torch.zeros_like(q)
    for (ctx, _), p in zip(parts, rows.joint_softmax(scores, parts, q.shape[1]), strict=True):
        out = out + (p @ ctx if ctx.dim() == 2 else torch.einsum("tk,tkd->td", p, ctx))
    return out
