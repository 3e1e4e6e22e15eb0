"""Paged device pools of a DSV4 model: KV per layer, index-K on c4 layers, compress state.

Every access to a layer's device data goes through `DevicePool.buffer(layer, kind)`, which
first passes the layer gate.  The buffers themselves sit in a private table, so a buffer
kind added later is reachable only through that accessor and cannot forget the gate.  The
transfer controller (the producer) writes through `_transfer_buffer`, the one ungated path.

`DSV4_INJECT_UNGATED_INDEX_K=1` (read when the pool is built) removes the gate for index-K
only: the seed incident's bug, kept as a switch so the race can be reproduced on demand.
A share instead of 1 (``0.15``) aims the race's rate: each HiCache load draws, with that
probability, whether index-K reads skip it — the part timing plays on a GPU, where only
some loads are still copying when the indexer reads (on this engine's throttled CPU copy
a skipped load is always still copying).

Stale reads are observed, not inferred: each (layer, page) carries the generation of the
HiCache load that last filled it (`_landed`, stamped by the transfer controller once the
layer's copy of that page is in and verified) next to the generation it is owed (`_owed`,
set when a load of the page starts).  Every KV and index-K read compares the two for its
pages and counts a read that found its layer not yet landed (`stale_reads`): 0 when reads
wait at the gate, more than 0 when index-K skips it and outruns a load.  On CUDA the tables
and counters live on the device, so the check adds no host synchronisation.
"""

from __future__ import annotations

import logging
import os
import random

import torch

from dsv4_engine.engine_config import UNGATED_INDEX_K_ENV
from dsv4_engine.features import IndexDtype
from dsv4_engine.kernels import KernelOps, default_backend, get_ops
from dsv4_engine.pools.allocator import PageAllocator
from dsv4_engine.pools.gate import LayerGate
from dsv4_engine.pools.layout import BufferKind, ModelShape, PoolLayout, pool_layout

logger = logging.getLogger(__name__)


def ungated_index_k_from_env() -> float:
    """The share of HiCache loads whose index-K reads skip the gate (0: none, 1: all)."""
    value = os.environ.get(UNGATED_INDEX_K_ENV, "0")
    try:
        share = float(value)
    except ValueError:
        share = -1.0
    if not 0.0 <= share <= 1.0:
        raise ValueError(
            f"{UNGATED_INDEX_K_ENV}={value!r}: expected 0, 1 or a share of loads in between"
        )
    return share


class DevicePool:
    def __init__(
        self,
        shape: ModelShape,
        num_pages: int,
        index_dtype: IndexDtype = IndexDtype.FP8,
        *,
        max_requests: int = 8,
        device: str | torch.device = "cpu",
        backend: str | None = None,
        ungated_index_k: bool | float | None = None,
        gate_timeout_s: float = 60.0,
    ) -> None:
        self.layout: PoolLayout = pool_layout(shape, index_dtype)
        self.shape = shape
        self.device = torch.device(device)
        self.allocator = PageAllocator(num_pages)
        self.gate = LayerGate(shape.num_layers, gate_timeout_s)
        # Looked up once: every store, read and score needs it, and the layout is a list scan.
        self._entries_per_page = {
            layer: self.layout.segment(layer, BufferKind.KV).entries
            for layer in range(shape.num_layers)
        }
        self.ops: KernelOps = get_ops(backend or default_backend(self.device))
        # Load generations per (layer, page): owed by the latest load, landed by the copy.
        self._owed = torch.zeros((shape.num_layers, num_pages), dtype=torch.int64, device=device)
        self._landed = torch.zeros_like(self._owed)
        self._generation = 0
        self._stale = torch.zeros(len(BufferKind), dtype=torch.int64, device=device)
        self._kind_index = {kind: i for i, kind in enumerate(BufferKind)}
        self.ungated_share = float(
            ungated_index_k_from_env() if ungated_index_k is None else ungated_index_k
        )
        self._races = random.Random(0)  # which loads index-K skips (a share below 1)
        if self.ungated_share:
            logger.warning(
                "FAULT INJECTION %s=%g: index-K reads SKIP the per-layer transfer gate of "
                "that share of loads; they may race HiCache loads and return stale keys. "
                "Never use in production.",
                UNGATED_INDEX_K_ENV,
                self.ungated_share,
            )
        # Uninitialised on purpose: like GPU memory, a new pool holds garbage, not zeros.
        self.__buffers: dict[tuple[int, BufferKind], torch.Tensor] = {
            (s.layer, s.kind): torch.empty(
                (num_pages, s.page_bytes), dtype=torch.uint8, device=self.device
            )
            for s in self.layout.segments
        }
        for layer, ratio in enumerate(shape.compress_ratios):
            if ratio:
                self.__buffers[(layer, BufferKind.COMPRESS_STATE)] = torch.zeros(
                    (max_requests, ratio, shape.kv_dim), dtype=torch.float32, device=self.device
                )

    # -- the one accessor ---------------------------------------------------------------

    def buffer(self, layer: int, kind: BufferKind) -> torch.Tensor:
        """Layer `layer`'s `kind` buffer, after its load (if any) has landed.

        Call it for every access; do not keep the tensor across a load.
        """
        if not self.ungated_share:
            self.gate.wait_layer(layer)
        elif kind is BufferKind.INDEX_K:
            if self.ungated_share < 1.0:
                self.gate.wait_layer(layer, skip_raced=True)
        else:
            if kind is BufferKind.KV:  # fault injection: past the layer's index-K reads
                self.gate.release_raced(layer)
            self.gate.wait_layer(layer)
        return self._lookup(layer, kind)

    @property
    def ungated_index_k(self) -> bool:
        """Whether index-K reads skip the gate of any load (the fault is injected)."""
        return self.ungated_share > 0.0

    def _load_races(self) -> bool:
        """Transfer controller, as a load starts: whether index-K reads will skip it."""
        return self.ungated_share >= 1.0 or self._races.random() < self.ungated_share

    def _transfer_buffer(self, layer: int, kind: BufferKind) -> torch.Tensor:
        """Ungated: only the transfer controller, the producer the gate waits for, uses it."""
        return self._lookup(layer, kind)

    def _lookup(self, layer: int, kind: BufferKind) -> torch.Tensor:
        try:
            return self.__buffers[(layer, kind)]
        except KeyError:
            raise KeyError(f"layer {layer} has no {kind.value} buffer") from None

    def buffer_kinds(self) -> list[tuple[int, BufferKind]]:
        return list(self.__buffers)

    # -- paged entries ------------------------------------------------------------------

    def entries_per_page(self, layer: int) -> int:
        return self._entries_per_page[layer]

    def entry_locs(
        self, layer: int, pages: list[int], num_tokens: int | None = None
    ) -> torch.Tensor:
        """Entry locations of the first `num_tokens` tokens held by `pages`, in order."""
        entries = self.entries_per_page(layer)
        ratio = self.shape.compress_ratios[layer] or 1
        count = len(pages) * entries if num_tokens is None else num_tokens // ratio
        page_ids = torch.tensor(pages, dtype=torch.int64, device=self.device)
        locs = (page_ids[:, None] * entries + torch.arange(entries, device=self.device)).flatten()
        return locs[:count]

    def store_kv(self, layer: int, locs: torch.Tensor, values: torch.Tensor) -> None:
        self._kv_view(layer)[locs] = values.to(device=self.device, dtype=torch.bfloat16)

    def read_kv(self, layer: int, locs: torch.Tensor) -> torch.Tensor:
        view = self._kv_view(layer)
        self._count_stale(layer, BufferKind.KV, locs)
        return view[locs]

    def _kv_view(self, layer: int) -> torch.Tensor:
        return self.buffer(layer, BufferKind.KV).view(torch.bfloat16).view(-1, self.shape.kv_dim)

    def store_index_k(self, layer: int, locs: torch.Tensor, keys: torch.Tensor) -> None:
        buf = self.buffer(layer, BufferKind.INDEX_K)
        self.ops.store_index_k(
            buf, locs, keys.to(self.device), self.layout.index_format, self.entries_per_page(layer)
        )

    def read_index_k(self, layer: int, locs: torch.Tensor) -> torch.Tensor:
        buf = self.buffer(layer, BufferKind.INDEX_K)
        self._count_stale(layer, BufferKind.INDEX_K, locs)
        return self.ops.read_index_k(
            buf, locs, self.layout.index_format, self.entries_per_page(layer)
        )

    def index_scores(
        self, layer: int, locs: torch.Tensor, q: torch.Tensor, w: torch.Tensor
    ) -> torch.Tensor:
        """The lightning indexer's scores [T, n] of entries `locs` for the query heads of T
        tokens, q [T, H, d] and w [T, H], read straight from the pages."""
        buf = self.buffer(layer, BufferKind.INDEX_K)
        self._count_stale(layer, BufferKind.INDEX_K, locs)
        fmt = self.layout.index_format
        return self.ops.index_scores(buf, locs, fmt, self.entries_per_page(layer), q, w)

    def store_compress_state(
        self, layer: int, slot: int | torch.Tensor, state: torch.Tensor
    ) -> None:
        """One request's state [ratio, d] at `slot`, or a batch's [B, ratio, d] at slots [B]."""
        self.buffer(layer, BufferKind.COMPRESS_STATE)[slot] = state.to(self.device)

    def read_compress_state(self, layer: int, slot: int | torch.Tensor) -> torch.Tensor:
        return self.buffer(layer, BufferKind.COMPRESS_STATE)[slot].clone()

    # -- observed stale reads -------------------------------------------------------------

    def stale_reads(self, kind: BufferKind) -> int:
        """Reads of `kind` that found a page of their layer whose load had not landed."""
        return int(self._stale[self._kind_index[kind]])

    def _count_stale(self, layer: int, kind: BufferKind, locs: torch.Tensor) -> None:
        # With no load registered every page has landed what it is owed (finished loads
        # stamped every layer, failed ones were forgiven): nothing to compare.
        if not self.gate.tracking():
            return
        pages = locs // self._entries_per_page[layer]
        behind = (self._landed[layer, pages] != self._owed[layer, pages]).any()
        self._stale[self._kind_index[kind]] += behind

    def _expect_load(self, pages: torch.Tensor) -> int:
        """Transfer controller, as a load of `pages` starts: the generation they are owed."""
        self._generation += 1
        self._owed[:, pages] = self._generation
        return self._generation

    def _mark_landed(
        self, layer: int, pages: torch.Tensor, generation: int, ok: torch.Tensor | None
    ) -> None:
        """Transfer controller, after layer `layer` of a load is copied (on its stream): the
        pages whose copy verified (`ok`, all if None) now hold that load's generation."""
        if ok is None:
            self._landed[layer, pages] = generation
        else:
            landed = self._landed[layer, pages]
            self._landed[layer, pages] = torch.where(ok, generation, landed)

    def _forgive_load(self, pages: torch.Tensor, from_layer: int) -> None:
        """A load failed at `from_layer`: its pages are owed nothing more (they are dropped
        and reused fresh; reads of the failed layers meet the gate's TransferFailed)."""
        self._owed[from_layer:, pages] = self._landed[from_layer:, pages]
