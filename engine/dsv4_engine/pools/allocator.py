"""Page allocator with a free list and last-freed-first reuse.

Freed pages are handed out again without being cleared, most recently freed first, so a
fresh page holds another request's old bytes exactly as GPU memory does.  That is what
turns a read that races its load into a visibly wrong read instead of a read of zeros.
"""

from __future__ import annotations

from collections.abc import Iterable


class OutOfPages(RuntimeError):
    """The pool has fewer free pages than a request asked for."""


class PageAllocator:
    def __init__(self, num_pages: int) -> None:
        if not isinstance(num_pages, int) or num_pages <= 0:
            raise ValueError(f"num_pages={num_pages!r}: expected a positive integer")
        self.num_pages = num_pages
        # The end of the list is the top of the stack: pop() reuses the last page freed.
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        self._used: set[int] = set()

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n < 0:
            raise ValueError(f"n={n}: expected a non-negative page count")
        if n > len(self._free):
            raise OutOfPages(f"asked for {n} pages, {len(self._free)} free of {self.num_pages}")
        pages = [self._free.pop() for _ in range(n)]
        self._used.update(pages)
        return pages

    def free(self, pages: Iterable[int]) -> None:
        pages = list(pages)
        unknown = [p for p in pages if p not in self._used]
        if unknown or len(set(pages)) != len(pages):
            raise ValueError(f"free: pages {unknown or pages} are not allocated (double free?)")
        self._used.difference_update(pages)
        # Freed in order, so the first page of the list is the first handed out again.
        self._free.extend(reversed(pages))
