"""Prefix cache over pages: a radix tree whose edges are whole pages of token ids.

A node owns one page's worth of tokens and lives on the device (a device page), on the
host tier (a host page) or both.  Device pages of unreferenced leaves are evicted first
(least recently used); with HiCache they go to the host tier and a later match loads them
back through the gated per-layer loader; without it they are dropped.  Matching whole
pages only keeps cold and warm prefills on the same page-aligned chunks.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from dsv4_engine.hicache.cache import HiCache
from dsv4_engine.pools.allocator import OutOfPages, PageAllocator
from dsv4_engine.pools.gate import LayerLoad

_clock = itertools.count()


@dataclass(eq=False)
class Node:
    key: tuple[int, ...]
    parent: Node | None
    device_page: int | None = None
    host_page: int | None = None
    refs: int = 0
    last_use: int = 0
    load: LayerLoad | None = None
    children: dict[tuple[int, ...], Node] = field(default_factory=dict)


class RadixCache:
    def __init__(self, allocator: PageAllocator, page_size: int, hicache: HiCache | None) -> None:
        self.allocator = allocator
        self.page_size = page_size
        self.hicache = hicache
        self.root = Node((), None)
        self._by_host: dict[int, Node] = {}
        if hicache is not None:
            hicache.host.on_evict = self._host_evicted

    # -- lookups --------------------------------------------------------------------------

    def match(self, tokens: Sequence[int], max_pages: int) -> list[Node]:
        """Nodes of the longest cached page prefix of `tokens` (at most `max_pages`)."""
        nodes: list[Node] = []
        node = self.root
        for p in range(min(max_pages, len(tokens) // self.page_size)):
            child = node.children.get(tuple(tokens[p * self.page_size : (p + 1) * self.page_size]))
            if child is None or (child.device_page is None and child.host_page is None):
                break
            nodes.append(child)
            node = child
        return nodes

    def acquire(self, nodes: list[Node]) -> list[Node]:
        """Reference `nodes` for a request; host-only ones get a device page now and are
        returned, to be loaded with `load` (one batch per scheduler step, like SGLang).

        Raises OutOfPages (nothing referenced) when the device cannot hold them.
        """
        for n in nodes:
            n.refs += 1
        on_host = [n for n in nodes if n.device_page is None]
        if on_host:
            try:
                self.ensure_free(len(on_host))
            except OutOfPages:
                self.release(nodes)
                raise
            for n, page in zip(on_host, self.allocator.allocate(len(on_host)), strict=True):
                n.device_page = page
        now = next(_clock)
        for n in nodes:
            n.last_use = now
        return on_host

    def load(self, nodes: list[Node]) -> None:
        """Start one host→device load for `nodes` (returned by `acquire`)."""
        if not nodes:
            return
        assert self.hicache is not None
        host_pages = [n.host_page for n in nodes]
        device_pages = [n.device_page for n in nodes]
        assert None not in host_pages and None not in device_pages
        self.hicache.host.touch(host_pages)  # type: ignore[arg-type]
        load = self.hicache.controller.load(host_pages, device_pages)  # type: ignore[arg-type]
        for n in nodes:
            n.load = load

    def release(self, nodes: list[Node]) -> None:
        now = next(_clock)
        for n in nodes:
            n.refs -= 1
            n.last_use = now

    # -- insertion ------------------------------------------------------------------------

    def insert(self, tokens: Sequence[int], pages: Sequence[int]) -> list[int]:
        """Cache the full pages of a finished request; returns its pages the tree did not
        take (already cached by someone else), for the caller to free."""
        node, spare = self.root, []
        new_pages: list[int] = []
        for p, page in enumerate(pages):
            key = tuple(tokens[p * self.page_size : (p + 1) * self.page_size])
            child = node.children.get(key)
            if child is not None and child.device_page == page:
                pass  # the request's own matched node
            elif child is not None and child.device_page is not None:
                spare.append(page)
            elif child is not None:  # host only: adopt the fresh device copy
                child.device_page = page
                new_pages.append(page)
            else:
                child = Node(key, node, device_page=page)
                node.children[key] = child
                new_pages.append(page)
            child.last_use = next(_clock)
            node = child
        if self.hicache is not None and new_pages:
            self._write_through([self._node_of(node, page) for page in new_pages])
        return spare

    def _node_of(self, leaf: Node, page: int) -> Node:
        node: Node | None = leaf
        while node is not None and node.device_page != page:
            node = node.parent
        assert node is not None
        return node

    def _write_through(self, nodes: list[Node]) -> None:
        assert self.hicache is not None
        todo = [n for n in nodes if n.host_page is None]
        host_pages = self.hicache.on_insert(
            [n.device_page for n in todo if n.device_page is not None]
        )
        if host_pages is not None:
            for n, hp in zip(todo, host_pages, strict=True):
                n.host_page = hp
                self._by_host[hp] = n

    def drop_failed_loads(self) -> list[LayerLoad]:
        """Forget the device copies of nodes whose load failed (their host copies stay);
        returns those loads, for the caller to discard from the gate once nothing uses them.
        """
        failed: list[LayerLoad] = []
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            load = n.load
            if load is None or not load.failed():
                continue
            assert n.refs == 0, "a request still holds a node whose load failed"
            if n.device_page is not None:
                self.allocator.free([n.device_page])
            n.device_page, n.load = None, None
            if load not in failed:
                failed.append(load)
        return failed

    # -- eviction -------------------------------------------------------------------------

    def ensure_free(self, pages: int) -> None:
        """Evict LRU unreferenced device leaves until `pages` are free (or raise OutOfPages)."""
        while self.allocator.free_pages < pages:
            victims = self._evictable()
            if not victims:
                raise OutOfPages(
                    f"need {pages} pages, {self.allocator.free_pages} free and none evictable"
                )
            victims.sort(key=lambda n: n.last_use)
            self._evict(victims[: pages - self.allocator.free_pages])

    def offload_all(self) -> int:
        """Evict every unreferenced device page (to host with HiCache); tokens evicted."""
        evicted = 0
        while victims := self._evictable():
            self._evict(victims)
            evicted += len(victims) * self.page_size
        return evicted

    def _evictable(self) -> list[Node]:
        """Unreferenced device nodes none of whose children is on the device."""
        out = []
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            if n.device_page is None or n.refs or (n.load is not None and not n.load.done()):
                continue
            if all(c.device_page is None for c in n.children.values()):
                out.append(n)
        return out

    def _evict(self, nodes: list[Node]) -> None:
        pages = [n.device_page for n in nodes if n.device_page is not None]
        if self.hicache is None:
            self.allocator.free(pages)
            for n in nodes:
                self._detach(n)
            return
        known = [n.host_page for n in nodes]
        if all(hp is not None for hp in known):
            self.hicache.evict(pages, [hp for hp in known if hp is not None])
        else:
            fresh = [n for n in nodes if n.host_page is None]
            host_pages = self.hicache.backup(
                [n.device_page for n in fresh if n.device_page is not None]
            )
            for n, hp in zip(fresh, host_pages, strict=True):
                n.host_page = hp
                self._by_host[hp] = n
            self.allocator.free(pages)
        for n in nodes:
            n.device_page, n.load = None, None

    def _host_evicted(self, host_pages: list[int]) -> None:
        """The host tier dropped these pages (LRU): forget them; drop nodes left nowhere."""
        nodes = [self._by_host.pop(hp) for hp in host_pages if hp in self._by_host]
        for node in nodes:
            node.host_page = None
        for node in nodes:
            if node.device_page is None:
                self._detach(node)

    def _detach(self, node: Node) -> None:
        """Remove a node that holds no page; host copies below it become unreachable."""
        if node.parent is not None:
            node.parent.children.pop(node.key, None)
        stack = list(node.children.values())
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            held = n.host_page is not None and self._by_host.pop(n.host_page, None) is not None
            if held and self.hicache is not None:
                self.hicache.host.free([n.host_page])
            if n.device_page is not None:
                self.allocator.free([n.device_page])

    def cached_tokens(self) -> tuple[int, int]:
        """(tokens on device, tokens on host) held by the tree."""
        device = host = 0
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            device += n.device_page is not None
            host += n.host_page is not None
        return device * self.page_size, host * self.page_size
