"""The reconcile loop: watches fill the cache and wake deployments, a queue runs their passes.

Built like a controller-runtime controller.  Informers (`kube.informer`, one per
`watches.WATCHES` entry) keep the cache current and hand each change to `triggers`, which
says whose pass it calls for; kopf hands the DSV4Deployments' own events over the same way
(`reconcile.handlers`).  Woken keys go into one `WorkQueue`, drained by a bounded number of
workers, each pass in a thread of its own pool (so passes never delay the leader Lease's
renewals).  Around each pass:

- it waits until the informers have listed once (a pass never reads a cache that is still
  filling) and until the cache shows the deployment's previous writes (`expectations`);
- a change of the deployment itself queues it at once; a child's change after a short
  settle window, so that the burst of status updates a rollout step causes is one pass;
- after a pass, its next deadline (progress deadline, placement timeout) and its resync
  are scheduled; resyncs land at each deployment's own offset in the period
  (`spread.phase` of its UID), so deployments created together do not resync together;
- a pass that failed is retried with exponential backoff.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections import Counter, deque
from collections.abc import Sequence
from typing import Any

from dsv4_operator import metrics
from dsv4_operator.api import KIND
from dsv4_operator.kube.cache import Cache, Obj
from dsv4_operator.kube.client import RESOURCES, ApiError, Kube, NotLeader
from dsv4_operator.kube.informer import Informer
from dsv4_operator.reconcile import triggers
from dsv4_operator.reconcile.queue import WorkQueue
from dsv4_operator.reconcile.reconciler import Reconciler, parse_status
from dsv4_operator.reconcile.watches import WATCHES
from dsv4_operator.render.meta import Owner
from dsv4_operator.spread import next_slot, phase

log = logging.getLogger("dsv4_operator.controller")

Key = tuple[str, str]  # (namespace, name) of a DSV4Deployment
SETTLE_S = 1.0  # a child's change wakes its deployment this long after (bursts: one pass)
CATCH_UP_S = 0.2  # a pass held for the cache to show its last writes is looked at again
RECHECK_SLACK_S = 1.0  # a deadline's pass runs this long after it, so it surely finds it passed
# Passes at once.  A converging pass mostly waits on the API server (a dozen applies), a
# settled one reads memory only: many threads cost little and keep the server busy.
WORKERS = 16
DURATIONS_KEPT = 100_000


def _ignore(old: Obj | None, new: Obj | None) -> None:
    """What another owner's object does: nothing (a name it frees is retried by the resync)."""


class Controller:
    def __init__(
        self,
        reconciler: Reconciler,
        cache: Cache,
        loop: asyncio.AbstractEventLoop,
        workers: int = WORKERS,
        resync_s: float = 60.0,
        settle_s: float = SETTLE_S,
    ) -> None:
        self.reconciler = reconciler
        self.cache = cache
        self.loop = loop
        self.workers = workers
        self.resync_s = resync_s
        self.settle_s = settle_s
        self.queue: WorkQueue[Key] = WorkQueue(loop)
        self.informers: list[Informer] = []
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, "reconcile")
        # What the passes did, for /debug/passes: whose, started and ended (monotonic).
        self.durations: deque[tuple[Key, float, float]] = deque(maxlen=DURATIONS_KEPT)
        self.passes = 0
        self.held = 0  # passes put off until the cache showed the last writes
        # What asked for passes, by watched kind (many coalesce into one pass): where a
        # deployment's passes come from when there are more than its decisions need.
        self.wakes: Counter[str] = Counter()
        # Deployments deleted while a pass of theirs ran (by key: their uid): that pass may
        # remember them again as it ends, so they are forgotten again once it has.
        self._gone: dict[Key, str] = {}

    # -- what wakes a deployment --------------------------------------------------------
    def start_informers(self, kube: Kube, namespaces: Sequence[str]) -> None:
        """One informer per watched kind and namespace (every namespace: one each)."""
        for watch in WATCHES:
            namespaced = RESOURCES[watch.kind].namespaced
            scopes: Sequence[str | None] = namespaces if namespaces and namespaced else [None]
            for namespace in scopes:
                informer = Informer(
                    kube,
                    watch,
                    self.cache.store(watch.stored_as),
                    _ignore
                    if watch.stored_as != watch.kind  # other owners' names wake nothing
                    else lambda old, new, kind=watch.kind: self.changed(kind, old, new),
                    namespace,
                )
                self.informers.append(informer)
                informer.start()

    def changed(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        """A watched object changed (called on an informer's thread)."""
        key = triggers.woken(kind, old, new, self.cache)
        if key is not None:
            self.loop.call_soon_threadsafe(self._woken, kind, key)

    def _woken(self, kind: str, key: Key) -> None:
        self.wakes[kind] += 1
        self.queue.add_after(key, self.settle_s)

    def deployment_event(self, event_type: str | None, raw: Obj) -> None:
        """A DSV4Deployment was listed, added, changed or deleted (kopf, on the loop)."""
        store = self.cache.store(KIND)
        meta = raw["metadata"]
        key = (meta["namespace"], meta["name"])
        if event_type == "DELETED":
            store.remove(raw)
            self.queue.drop(key)
            self.reconciler.forget(*key, meta["uid"])
            if self.queue.processing(key):
                self._gone[key] = meta["uid"]
            return
        old = store.upsert(raw)
        if triggers.deployment_changed(old, raw, lambda obj: self._own_status(key, obj)):
            self.wakes[KIND] += 1
            self.queue.add(key)

    def _own_status(self, key: Key, obj: Obj) -> bool:
        status = parse_status(obj.get("status"))
        return status is not None and self.reconciler.expectations.own_status(key, status)

    def wake(self, owner: Owner) -> None:
        """Something outside the watches has news for a deployment (a probe run in this
        process filed its report); thread-safe."""
        self.loop.call_soon_threadsafe(self.queue.add, (owner.namespace, owner.name))

    # -- running passes -----------------------------------------------------------------
    async def run(self, synced: asyncio.Event | None = None) -> None:
        """Wait for the caches, then run passes for ever (cancel to stop)."""
        while not all(self.cache.store(w.stored_as).synced.is_set() for w in WATCHES):
            await asyncio.sleep(0.1)
        log.info(
            "caches synced", extra={"objects": {k: len(s) for k, s in self.cache.stores.items()}}
        )
        if synced is not None:
            synced.set()
        workers = [asyncio.create_task(self._worker()) for _ in range(self.workers)]
        try:
            await asyncio.gather(*workers)
        finally:
            for worker in workers:
                worker.cancel()
            for informer in self.informers:
                informer.stop()
            self._pool.shutdown(wait=False, cancel_futures=True)

    async def _worker(self) -> None:
        while True:
            key = await self.queue.get()
            try:
                await self._process(key)
            finally:
                self.queue.done(key)
                uid = self._gone.pop(key, None)
                if uid is not None:  # deleted during the pass, which may have remembered it
                    reused = self.cache.get(KIND, *key) is not None  # made again since
                    self.reconciler.forget(*key, uid, name_reused=reused)

    async def _process(self, key: Key) -> None:
        if not self.reconciler.expectations.met(key, self.cache):
            self.held += 1
            self.queue.add_after(key, CATCH_UP_S)
            return
        namespace, name = key
        started = time.monotonic()
        try:
            recheck = await self.loop.run_in_executor(
                self._pool, self.reconciler.reconcile_now, namespace, name
            )
        except NotLeader as err:
            metrics.RECONCILES.labels("error").inc()
            log.warning("reconcile of %s/%s stopped: %s", namespace, name, err)
            return
        except ApiError as err:
            # Retries are exhausted: the pass is tried again after a backoff.
            metrics.RECONCILES.labels("error").inc()
            delay = self.queue.retry(key)
            log.warning(
                "reconcile of %s/%s failed (again in %.1fs): %s", namespace, name, delay, err
            )
            recheck = None
        except Exception:  # a bug must not stop the other deployments' passes
            metrics.RECONCILES.labels("error").inc()
            delay = self.queue.retry(key)
            log.exception("reconcile of %s/%s crashed (again in %.1fs)", namespace, name, delay)
            recheck = None
        else:
            metrics.RECONCILES.labels("ok").inc()
            self.queue.forget(key)
        ended = time.monotonic()
        metrics.RECONCILE_SECONDS.observe(ended - started)
        self.passes += 1
        self.durations.append((key, started, ended))
        self._schedule(key, recheck)

    def _schedule(self, key: Key, recheck: float | None) -> None:
        obj = self.cache.get(KIND, *key)
        if obj is None:
            self.queue.drop(key)
            return
        self.queue.schedule(key, "recheck", None if recheck is None else recheck + RECHECK_SLACK_S)
        now = self.loop.time()
        at = next_slot(now + self.resync_s / 2, self.resync_s, phase(obj["metadata"]["uid"]))
        self.queue.schedule(key, "resync", at - now)

    def stats(self) -> dict[str, Any]:
        return {
            "passes": self.passes,
            "held": self.held,
            "remembered": self.reconciler.remembered(),
            "cached": len(self.cache.store(KIND)),
            "wakes": dict(self.wakes),
            "queued": len(self.queue),
            "durations": [round(end - start, 6) for _, start, end in self.durations],
            # Which deployment each pass was for and when it started (the clock is the
            # machine's monotonic one: another process on it can tell which passes came
            # before what it saw).
            "started": [
                [f"{ns}/{name}", round(start, 3)] for (ns, name), start, _ in self.durations
            ],
        }
