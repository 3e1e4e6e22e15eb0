"""What the caches must show of this process's own writes before a deployment's next pass.

A watch-fed cache lags the API server by the time an event takes to arrive.  Lagging
behind someone else's change is harmless — that change's own event starts another pass —
but lagging behind the operator's *own* last writes is not: the next pass would find the
children it just created missing, or decide again from the status it just replaced (the
status write's resourceVersion precondition would refuse that, at the cost of a wasted
pass).  So, like the ReplicaSet controller's expectations, every write a pass makes is
remembered until the cache shows it, and the controller holds a deployment's next pass
until then (or until `TTL_S`, should an event be lost: the status precondition still
guards correctness, and the resync repairs the rest).

It also remembers the status each deployment was last given, which is how the operator
tells its own status write from someone else's when the watch reports it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dsv4_operator.kube.cache import Reader

TTL_S = 30.0
DeploymentKey = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True)
class Write:
    """One write, as the cache will show it: the object present with another version than
    ``before`` (None: it did not exist), or — ``gone`` — absent or being deleted."""

    kind: str
    namespace: str
    name: str
    before: str | None
    gone: bool = False

    def shown(self, cache: Reader) -> bool:
        obj = cache.get(self.kind, self.namespace, self.name)
        if self.gone:
            return obj is None or bool(obj["metadata"].get("deletionTimestamp"))
        return obj is not None and obj["metadata"].get("resourceVersion") != self.before


class Expectations:
    """Thread-safe: passes record from worker threads, the controller checks on its loop."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._writes: dict[DeploymentKey, tuple[float, list[Write]]] = {}
        self._status: dict[DeploymentKey, Any] = {}

    def wrote(self, key: DeploymentKey, write: Write) -> None:
        with self._lock:
            _, writes = self._writes.get(key, (0.0, []))
            self._writes[key] = (self._clock(), [*writes, write])

    def met(self, key: DeploymentKey, cache: Reader) -> bool:
        """The cache shows every write of ``key``'s earlier passes (or they expired)."""
        with self._lock:
            at, writes = self._writes.get(key, (0.0, []))
        if not writes:
            return True
        if self._clock() - at > TTL_S or all(w.shown(cache) for w in writes):
            with self._lock:
                if self._writes.get(key, (None,))[0] == at:
                    del self._writes[key]
            return True
        return False

    def status_written(self, key: DeploymentKey, status: Any) -> None:
        """Record the status about to be written (before it is sent: its watch event may
        arrive before the write's own response)."""
        with self._lock:
            self._status[key] = status

    def own_status(self, key: DeploymentKey, status: Any) -> bool:
        with self._lock:
            return key in self._status and self._status[key] == status

    def forget(self, key: DeploymentKey) -> None:
        with self._lock:
            self._writes.pop(key, None)
            self._status.pop(key, None)

    def __len__(self) -> int:
        """How many deployments it holds something for."""
        with self._lock:
            return len(self._writes.keys() | self._status.keys())
