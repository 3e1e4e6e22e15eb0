"""In-memory copies of the objects the reconciler reads, kept current by watches.

A pass reads the world through `get`/`list` — the signature of `Kube` — so the reconciler
is the same code whether it reads the API server (the API double of the unit tests does)
or this cache (the operator does).  Each kind has a `Store`, filled by an informer's list
and kept current by its watch (`kube.informer`), indexed by namespace and by the
label values the operator selects on (a deployment's instance label, a node's GPU product),
so a pass answers "the children of flash" or "is there a B200 node" without a scan.

The objects are shared, not copied: nothing that reads the cache may change what it got
(the unit harness checks this after every pass).
"""

from __future__ import annotations

import functools
import threading
from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from dsv4_operator.kube import selectors

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace or "", name)


class Reader(Protocol):
    """Where a pass reads objects: the caches, or (the unit harness) the API itself."""

    def get(self, kind: str, namespace: str | None, name: str) -> Obj | None: ...

    def list(
        self,
        kind: str,
        namespace: str | None,
        selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[Obj]: ...

    def exists(self, kind: str, namespace: str | None, selector: str) -> bool:
        """Whether any object matches ``selector`` (a node with an allowed GPU product)."""
        ...

    def served(self, kind: str) -> bool:
        """Whether the API server serves ``kind`` (a CRD's kind: LeaderWorkerSet only where
        LWS is installed)."""
        ...

    def holder(self, kind: str, namespace: str, name: str) -> Obj | None:
        """Whatever holds that name now: one of the operator's objects, or another owner's
        (its metadata).  None: the name is free."""
        ...


def foreign(kind: str) -> str:
    """The store of the objects of ``kind`` that are not the operator's: their names only."""
    return f"{kind}/foreign"


def key_of(obj: Obj) -> Key:
    meta = obj["metadata"]
    return meta.get("namespace") or "", meta["name"]


@functools.lru_cache(maxsize=1024)
def _labels(selector: str | None) -> tuple[selectors.Term, ...]:
    return selectors.parse(selector)


@functools.lru_cache(maxsize=64)
def _fields(selector: str | None) -> selectors.Match:
    return selectors.field_match(selector)


class Store:
    """One kind's objects by (namespace, name), with label indexes; thread-safe (a watch
    thread writes, reconcile threads read)."""

    def __init__(self, kind: str, indexed_labels: Iterable[str] = ()) -> None:
        self.kind = kind
        self.indexed_labels = tuple(indexed_labels)
        self._lock = threading.Lock()
        self._objects: dict[Key, Obj] = {}
        self._by_namespace: defaultdict[str, set[Key]] = defaultdict(set)
        # (label, value) -> keys, every namespace (cluster-scoped kinds use namespace "").
        self._by_label: defaultdict[tuple[str, str], set[Key]] = defaultdict(set)
        self.synced = threading.Event()
        self.served = True  # False: the API server does not know the kind (its CRD is absent)

    def __len__(self) -> int:
        return len(self._objects)

    # -- writes (the informer) ----------------------------------------------------------
    def upsert(self, obj: Obj) -> Obj | None:
        """Store ``obj``; returns what it replaced."""
        key = key_of(obj)
        with self._lock:
            old = self._objects.get(key)
            if old is not None:
                self._unindex(key, old)
            self._objects[key] = obj
            self._index(key, obj)
        return old

    def remove(self, obj: Obj) -> Obj | None:
        key = key_of(obj)
        with self._lock:
            old = self._objects.pop(key, None)
            if old is not None:
                self._unindex(key, old)
        return old

    def replace(
        self, objs: Iterable[Obj], served: bool = True
    ) -> list[tuple[Obj | None, Obj | None]]:
        """The whole content at once (a list, or a relist after the watch lost its place);
        returns what changed as (old, new) pairs, so a relist still tells who to wake."""
        fresh = {key_of(o): o for o in objs}
        with self._lock:
            before = self._objects
            changes: list[tuple[Obj | None, Obj | None]] = [
                (before.get(k), o)
                for k, o in fresh.items()
                if _version(before.get(k)) != _version(o)
            ]
            changes += [(o, None) for k, o in before.items() if k not in fresh]
            self._objects = {}
            self._by_namespace.clear()
            self._by_label.clear()
            for key, obj in fresh.items():
                self._objects[key] = obj
                self._index(key, obj)
        self.served = served  # before `synced`: no reader sees a synced store's old answer
        self.synced.set()
        return changes

    def unserved(self) -> list[tuple[Obj | None, Obj | None]]:
        """The API server does not know this kind: empty, and synced (nothing to wait for)."""
        return self.replace([], served=False)

    def _index(self, key: Key, obj: Obj) -> None:
        self._by_namespace[key[0]].add(key)
        labels = obj["metadata"].get("labels") or {}
        for label in self.indexed_labels:
            if label in labels:
                self._by_label[(label, labels[label])].add(key)

    def _unindex(self, key: Key, obj: Obj) -> None:
        self._by_namespace[key[0]].discard(key)
        labels = obj["metadata"].get("labels") or {}
        for label in self.indexed_labels:
            if label in labels:
                self._by_label[(label, labels[label])].discard(key)

    # -- reads (the reconciler) ---------------------------------------------------------
    def get(self, namespace: str | None, name: str) -> Obj | None:
        return self._objects.get((namespace or "", name))

    def select(
        self, namespace: str | None, selector: str | None, field_selector: str | None
    ) -> list[Obj]:
        terms = _labels(selector)
        fields = _fields(field_selector)
        with self._lock:
            found = [self._objects[k] for k in self._candidates(namespace, terms)]
        return [
            o
            for o in sorted(found, key=key_of)
            if selectors.matches(terms, o["metadata"].get("labels") or {}) and fields(o)
        ]

    def exists(self, namespace: str | None, selector: str) -> bool:
        """Whether any object matches: the first match answers, nothing is copied or
        sorted, so "is there a B200 node" costs a pass the same at ten nodes and a
        thousand (a `select` of them all was the largest part of a settled pass's CPU)."""
        terms = _labels(selector)
        with self._lock:
            return any(
                selectors.matches(terms, self._objects[k]["metadata"].get("labels") or {})
                for k in self._candidates(namespace, terms)
            )

    def _candidates(
        self, namespace: str | None, terms: tuple[selectors.Term, ...]
    ) -> Iterator[Key]:
        """Keys that may match (call with the lock held): from a label index when the
        selector pins an indexed label, else the namespace's (None: every namespace)."""
        for label in self.indexed_labels:
            values = selectors.pinned(terms, label)
            if values is not None:
                for value in values:
                    for key in self._by_label.get((label, value), ()):
                        if namespace is None or key[0] == namespace:
                            yield key
                return
        yield from self._objects if namespace is None else self._by_namespace.get(namespace, ())


def _version(obj: Obj | None) -> str | None:
    return obj["metadata"].get("resourceVersion") if obj is not None else None


class Cache:
    """Every store, read with `Kube`'s `get`/`list` signature."""

    def __init__(self, stores: Iterable[Store]) -> None:
        self.stores = {store.kind: store for store in stores}

    def store(self, kind: str) -> Store:
        try:
            return self.stores[kind]
        except KeyError:
            raise KeyError(f"no cache of {kind} objects: add a watch for it") from None

    def get(self, kind: str, namespace: str | None, name: str) -> Obj | None:
        return self.store(kind).get(namespace, name)

    def exists(self, kind: str, namespace: str | None, selector: str) -> bool:
        return self.store(kind).exists(namespace, selector)

    def served(self, kind: str) -> bool:
        return self.store(kind).served

    def holder(self, kind: str, namespace: str, name: str) -> Obj | None:
        return self.get(kind, namespace, name) or self.get(foreign(kind), namespace, name)

    def list(
        self,
        kind: str,
        namespace: str | None,
        selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[Obj]:
        return self.store(kind).select(namespace, selector, field_selector)
