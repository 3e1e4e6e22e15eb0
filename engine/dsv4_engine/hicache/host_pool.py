"""The host tier of HiCache: pages in CPU memory mirroring device pages, with LRU eviction.

One host page holds every segment of one device page (every layer's KV and index-K).
`page_first` keeps a page's segments together (one page is one contiguous row: cheap to
write back whole pages); `layer_first` keeps a layer's pages together (one layer's load
reads one contiguous block).  `page_first_direct` has the `page_first` memory layout; in
SGLang it differs only in the copy path.  Each segment of each page carries the checksum
taken when it was written, so a load can prove what arrived is what was stored.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable

import torch

from dsv4_engine.features import HiCacheMemLayout
from dsv4_engine.pools.layout import BufferKind, PoolLayout

GIB = 1 << 30


class HostPoolFull(RuntimeError):
    """Every host page is in use and pinned by a load in flight."""


def host_capacity_pages(
    layout: PoolLayout,
    device_pages: int,
    ratio: float | None = None,
    size_bytes: int | None = None,
) -> int:
    """Host pages from a size (wins when given, like `--hicache-size`) or a device ratio."""
    if size_bytes is not None:
        if size_bytes < layout.page_bytes:
            raise ValueError(
                f"hicache size {size_bytes} B: expected at least one page ({layout.page_bytes} B)"
            )
        return size_bytes // layout.page_bytes
    if ratio is None or ratio <= 1:
        raise ValueError(f"hicache ratio={ratio!r}: expected a number > 1 (or a size)")
    return int(device_pages * ratio)


class HostPool:
    def __init__(
        self,
        layout: PoolLayout,
        num_pages: int,
        mem_layout: HiCacheMemLayout = HiCacheMemLayout.PAGE_FIRST,
        *,
        pin_memory: bool = False,
        on_evict: Callable[[list[int]], None] | None = None,
    ) -> None:
        if num_pages <= 0:
            raise ValueError(f"host num_pages={num_pages}: expected a positive integer")
        self.layout = layout
        self.num_pages = num_pages
        self.mem_layout = HiCacheMemLayout(mem_layout)
        self.on_evict = on_evict
        self._flat = torch.empty(num_pages * layout.page_bytes, dtype=torch.uint8)
        if pin_memory:
            self._flat = self._flat.pin_memory()
        self._segments = {
            (s.layer, s.kind): self._segment_view(i) for i, s in enumerate(layout.segments)
        }
        self._checksums = torch.zeros((num_pages, len(layout.segments)), dtype=torch.int64)
        self._seg_index = {(s.layer, s.kind): i for i, s in enumerate(layout.segments)}
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        self._lru: OrderedDict[int, None] = OrderedDict()  # in use, oldest first
        self._pins: Counter[int] = Counter()
        self._lock = threading.RLock()  # loads unpin from the transfer thread

    def _segment_view(self, index: int) -> torch.Tensor:
        seg = self.layout.segments[index]
        before = self.layout.segments[:index]
        if self.mem_layout is HiCacheMemLayout.LAYER_FIRST:
            layer_base = sum(self.layout.layer_page_bytes(lyr) for lyr in range(seg.layer))
            layer_bytes = self.layout.layer_page_bytes(seg.layer)
            offset = sum(s.page_bytes for s in before if s.layer == seg.layer)
            block = self._flat[layer_base * self.num_pages :][: layer_bytes * self.num_pages]
            return block.view(self.num_pages, layer_bytes)[:, offset : offset + seg.page_bytes]
        offset = sum(s.page_bytes for s in before)
        rows = self._flat.view(self.num_pages, self.layout.page_bytes)
        return rows[:, offset : offset + seg.page_bytes]

    def segment(self, layer: int, kind: BufferKind) -> torch.Tensor:
        """Host view [num_pages, segment bytes] of one layer's segment (rows may be strided)."""
        return self._segments[(layer, kind)]

    def checksums(self, layer: int, kind: BufferKind) -> torch.Tensor:
        """Stored checksum per host page of one segment (a view: writes update the table)."""
        return self._checksums[:, self._seg_index[(layer, kind)]]

    # -- page lifecycle -----------------------------------------------------------------

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        """n host pages; evicts least recently used unpinned pages (reported to on_evict)."""
        with self._lock:
            return self._allocate(n)

    def _allocate(self, n: int) -> list[int]:
        short = n - len(self._free)
        if short > 0:
            victims = [p for p in self._lru if not self._pins[p]][:short]
            if len(victims) < short:
                raise HostPoolFull(
                    f"asked for {n} host pages: {len(self._free)} free, "
                    f"{len(victims)} evictable of {self.num_pages}"
                )
            self._release(victims)
            if self.on_evict is not None:
                self.on_evict(victims)
        pages = [self._free.pop() for _ in range(n)]
        self._lru.update((p, None) for p in pages)
        return pages

    def free(self, pages: Iterable[int]) -> None:
        """Give pages back; a pinned page is refused: a load in flight reads it or a request
        holds it, and the next `allocate` would hand it to another prefix's backup."""
        pages = list(pages)
        with self._lock:
            unknown = [p for p in pages if p not in self._lru]
            if unknown:
                raise ValueError(f"free: host pages {unknown} are not allocated")
            pinned = [p for p in pages if self._pins[p]]
            if pinned:
                raise ValueError(f"free: host pages {pinned} are pinned")
            self._release(pages)

    def _release(self, pages: list[int]) -> None:
        for p in pages:
            del self._lru[p]
        self._free.extend(reversed(pages))

    def touch(self, pages: Iterable[int]) -> None:
        """Mark pages as just used (a prefix hit), so LRU evicts them last."""
        with self._lock:
            for p in pages:
                self._lru.move_to_end(p)

    def pin(self, pages: Iterable[int]) -> None:
        """Keep pages from eviction and reuse until as many `unpin`s: a load in flight
        reading them pins them, and so does each node a request holds (the prefix cache)."""
        with self._lock:
            self._pins.update(pages)

    def unpin(self, pages: Iterable[int]) -> None:
        """Undo one `pin` of each page (an unbalanced unpin raises: a count below zero would
        read as pinned for ever)."""
        with self._lock:
            want = Counter(pages)
            unbalanced = sorted(p for p, n in want.items() if self._pins[p] < n)
            if unbalanced:
                raise ValueError(f"unpin: host pages {unbalanced} are not pinned")
            self._pins.subtract(want)
            for p in want:
                if not self._pins[p]:
                    del self._pins[p]

    def pinned(self, page: int) -> bool:
        """Whether a load in flight or a request's node holds `page` (it may not be freed)."""
        with self._lock:
            return self._pins[page] > 0
