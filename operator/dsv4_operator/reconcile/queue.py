"""A work queue of deployment keys with controller-runtime's workqueue semantics.

- A key is queued at most once: adding one already waiting does nothing (coalesced).
- A key is processed by one worker at a time: adding one being processed marks it dirty,
  and it is queued once more when that worker is done — however many adds came meanwhile
  (N events during a pass: one follow-up pass).
- `add_after` delays an add; of several delayed adds of one key the earliest stands, so a
  burst of watch events opens one window and the pass runs once at its end.  A pass that
  starts while a delayed add waits covers it (the change that asked for it is in the cache
  the pass reads), so the add is dropped: no second pass for what the first one saw.
- `schedule` keeps one named timer per key (its resync, its next deadline), re-armed by
  each call: a deployment that just had a pass does not also get its old resync.
- `retry` re-adds a failed key after an exponential backoff; `forget` resets it.

Everything runs on one asyncio loop (callers on other threads use `call_soon_threadsafe`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
RETRY_BASE_S = 0.5
RETRY_MAX_S = 60.0


class WorkQueue(Generic[K]):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: deque[K] = deque()
        self._dirty: set[K] = set()
        self._processing: set[K] = set()
        self._ready = asyncio.Event()
        self._delayed: dict[K, tuple[float, asyncio.TimerHandle]] = {}
        self._timers: dict[tuple[K, str], asyncio.TimerHandle] = {}
        self._failures: dict[K, int] = {}
        self.added = 0  # adds that queued a key (not the coalesced ones)

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, key: K) -> None:
        if key in self._dirty:
            return
        self._dirty.add(key)
        if key in self._processing:
            return  # queued again when its worker is done
        self._queue.append(key)
        self.added += 1
        self._ready.set()

    def add_after(self, key: K, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        when = self._loop.time() + delay
        waiting = self._delayed.get(key)
        if waiting is not None:
            if waiting[0] <= when:
                return
            waiting[1].cancel()
        self._delayed[key] = (when, self._loop.call_at(when, self._fire, key))

    def _fire(self, key: K) -> None:
        self._delayed.pop(key, None)
        self.add(key)

    def schedule(self, key: K, purpose: str, delay: float | None) -> None:
        """The one ``purpose`` timer of ``key``: replaced, or cancelled (None)."""
        timer = self._timers.pop((key, purpose), None)
        if timer is not None:
            timer.cancel()
        if delay is not None:
            self._timers[(key, purpose)] = self._loop.call_later(max(delay, 0.0), self.add, key)

    def retry(self, key: K) -> float:
        """Add ``key`` again after its failure backoff; returns the delay."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        delay = min(RETRY_MAX_S, RETRY_BASE_S * 2**failures)
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        """Its failures are over (a pass succeeded)."""
        self._failures.pop(key, None)

    def drop(self, key: K) -> None:
        """The key is gone for good (its object was deleted): no timer keeps it alive."""
        self.forget(key)
        waiting = self._delayed.pop(key, None)
        if waiting is not None:
            waiting[1].cancel()
        for slot in [s for s in self._timers if s[0] == key]:
            self._timers.pop(slot).cancel()

    async def get(self) -> K:
        while not self._queue:
            self._ready.clear()
            await self._ready.wait()
        key = self._queue.popleft()
        self._processing.add(key)
        self._dirty.discard(key)
        waiting = self._delayed.pop(key, None)
        if waiting is not None:
            waiting[1].cancel()
        return key

    def processing(self, key: K) -> bool:
        """A worker holds ``key`` (its pass runs)."""
        return key in self._processing

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.append(key)
            self.added += 1
            self._ready.set()
