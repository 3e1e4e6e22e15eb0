"""List once, then watch: one kind's `Store` kept current, every change handed on.

The reflector of client-go, in a thread: list the objects (in pages) and the version of
that list, then watch from that version, applying each event to the store and telling
`on_change(old, new)` (``new`` None: deleted).  A watch the server ends is resumed from the
last version seen (bookmarks keep it fresh); one whose version is too old (410 Gone) or
that fails is followed by a new list, whose differences from the store are handed on as
changes too — a missed event is never a missed pass.  The first list hands nothing on: the
primary resource's own initial events start every deployment's first pass.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from dsv4_operator.kube.cache import Obj, Store
from dsv4_operator.kube.client import WATCH_TIMEOUT_S, ApiError, Kube, api_version

log = logging.getLogger("dsv4_operator.informer")

OnChange = Callable[[Obj | None, Obj | None], None]
GONE = 410
NOT_FOUND = 404
RETRY_S = (1.0, 30.0)  # first and longest pause after a failed list or watch


def keep(obj: Obj) -> Obj:
    return obj


@dataclass(frozen=True)
class Watch:
    """What one informer lists and watches, and how its objects are stored."""

    kind: str
    selector: str | None = None
    field_selector: str | None = None
    metadata_only: bool = False  # labels and existence are all a pass needs
    indexed_labels: tuple[str, ...] = ()
    # A CRD's kind the cluster may not serve (LeaderWorkerSet without LWS): a 404 on its list
    # is an empty, synced store marked unserved, and the list is retried until it is served.
    optional: bool = False
    # Drops what no pass reads (managedFields, a pod's spec) before an object is stored.
    transform: Callable[[Obj], Obj] = keep
    # The store it fills (`Cache.store`): its kind's, unless a second watch of the kind
    # keeps other objects apart (`cache.foreign`).
    store: str = ""
    why: str = field(default="", compare=False)

    @property
    def stored_as(self) -> str:
        return self.store or self.kind


class Informer:
    """One `Watch` over one namespace (None: every namespace) into ``store``."""

    def __init__(
        self,
        kube: Kube,
        watch: Watch,
        store: Store,
        on_change: OnChange,
        namespace: str | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.kube, self.watch, self.store = kube, watch, store
        self.on_change = on_change
        self.namespace = namespace
        self._rng = rng or random.Random()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"informer-{watch.kind}-{namespace or 'all'}", daemon=True
        )
        self.lists = 0  # how many times it listed (1 while its watches never broke)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        pause = RETRY_S[0]
        first = True
        while not self._stop.is_set():
            try:
                version = self._list(first)
                first = False
                pause = RETRY_S[0]
                while not self._stop.is_set():
                    version = self._watch(version)
            except _Relist:
                continue
            except _Unserved:
                log.debug("%s is not served; listing again later", self.watch.kind)
                pause = RETRY_S[1]
            except (ApiError, ValueError, KeyError) as err:
                if self._stop.is_set():  # stopped, then its connection went: nothing failed
                    return
                log.warning("watch of %s failed (%s); listing again", self.watch.kind, err)
            except Exception:  # noqa: BLE001 - the thread must outlive any bad response
                log.exception("watch of %s failed; listing again", self.watch.kind)
            self._stop.wait(pause * self._rng.uniform(0.5, 1.0))
            pause = min(RETRY_S[1], pause * 2)

    def _list(self, first: bool) -> str:
        watch = self.watch
        try:
            items, version = self.kube.snapshot(
                watch.kind,
                self.namespace,
                watch.selector,
                watch.field_selector,
                watch.metadata_only,
            )
        except ApiError as err:
            if err.status != NOT_FOUND or not watch.optional:
                raise
            self.lists += 1
            self.store.unserved()
            raise _Unserved from err
        self.lists += 1
        changes = self.store.replace([watch.transform(o) for o in items])
        if not first:
            for old, new in changes:
                self.on_change(old, new)
        return version

    def _watch(self, version: str) -> str:
        """One watch request, to its end; returns the version to resume from."""
        watch = self.watch
        # Spread the watches' ends, so they are not all renewed in the same second.
        timeout = int(WATCH_TIMEOUT_S * self._rng.uniform(0.5, 1.0))
        for event in self.kube.watch(
            watch.kind,
            self.namespace,
            version,
            watch.selector,
            watch.field_selector,
            watch.metadata_only,
            timeout,
        ):
            kind, raw = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                if raw.get("code") == GONE:
                    raise _Relist
                raise ApiError(int(raw.get("code") or 0), str(raw.get("message")))
            version = raw["metadata"]["resourceVersion"]
            if kind == "BOOKMARK":
                continue
            obj = watch.transform(
                {**raw, "apiVersion": api_version(watch.kind), "kind": watch.kind}
            )
            if kind == "DELETED":
                old = self.store.remove(obj)
                self.on_change(old or obj, None)
            else:
                self.on_change(self.store.upsert(obj), obj)
            if self._stop.is_set():
                break
        return version


class _Relist(Exception):
    """The watch's version is too old (410 Gone): list again."""


class _Unserved(Exception):
    """An optional kind's list answered 404: its store is empty and unserved; ask later."""
