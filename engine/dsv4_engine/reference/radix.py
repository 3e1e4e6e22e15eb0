"""Prefix cache over pages: a radix tree whose edges are whole pages of token ids.

A node owns one page's worth of tokens and lives on the device (a device page), on the
host tier (a host page) or both.  Device pages of unreferenced leaves are evicted first
(least recently used); with HiCache they go to the host tier and a later match loads them
back through the gated per-layer loader; without it they are dropped.  Matching whole
pages only keeps cold and warm prefills on the same page-aligned chunks.

A referenced node's host copy is pinned in the host tier (SGLang's HiRadixCache protects
the host nodes a request loads the same way): the host tier evicts its LRU pages whenever
a backup needs room — also while a request that matched a host-only prefix makes device
room for it — and a matched page evicted there, or freed and handed to another prefix's
backup, would be loaded as this prefix's (its checksum rewritten by the new owner, so no
check could tell).  A node the tree drops forgets its pages as it frees them.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from dsv4_engine.hicache.cache import HiCache
from dsv4_engine.hicache.host_pool import HostPoolFull
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
    host_pin: int | None = None  # the host page pinned while the node is referenced
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

        Their host copies are pinned first: making device room below backs pages up to the
        host tier, which evicts its least recently used pages, and those may be the very
        pages this request is about to load.  Raises OutOfPages (nothing referenced) when
        the device cannot hold them.
        """
        for n in nodes:
            n.refs += 1
            self._protect(n)
        on_host = [n for n in nodes if n.device_page is None]
        if on_host:
            try:
                self.ensure_free(len(on_host))
                pages = self.allocator.allocate(len(on_host))
            except Exception:
                self.release(nodes)
                raise
            for n, page in zip(on_host, pages, strict=True):
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

    def cancel_load(self, nodes: list[Node]) -> None:
        """Give back the device pages `acquire` reserved for `nodes` when their load did not
        start: nothing was copied into them, so no node may keep claiming them (a later
        match would read whatever their previous owner left there)."""
        for n in nodes:
            if n.load is None and n.device_page is not None:
                self.allocator.free([n.device_page])
                n.device_page = None

    def release(self, nodes: list[Node]) -> None:
        now = next(_clock)
        for n in nodes:
            n.refs -= 1
            n.last_use = now
            if not n.refs:
                self._unprotect(n)

    def _protect(self, node: Node) -> None:
        """Pin a referenced node's host copy, so host-tier eviction cannot take it."""
        if node.refs and node.host_page is not None and node.host_pin is None:
            assert self.hicache is not None
            self.hicache.host.pin([node.host_page])
            node.host_pin = node.host_page

    def _unprotect(self, node: Node) -> None:
        if node.host_pin is not None:
            assert self.hicache is not None
            self.hicache.host.unpin([node.host_pin])
            node.host_pin = None

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
        try:
            host_pages = self.hicache.on_insert(
                [n.device_page for n in todo if n.device_page is not None]
            )
        except HostPoolFull:  # every host page is pinned: backed up on eviction, if then
            return
        if host_pages is not None:
            for n, hp in zip(todo, host_pages, strict=True):
                self._set_host(n, hp)

    def _set_host(self, node: Node, host_page: int) -> None:
        """`node`'s host copy is now `host_page` (pinned if the node is referenced)."""
        node.host_page = host_page
        self._by_host[host_page] = node
        self._protect(node)

    def drop_failed_loads(self) -> list[LayerLoad]:
        """Forget the device copies of nodes whose load failed (their host copies stay);
        returns those loads, for the caller to discard from the gate once nothing uses them.
        """
        failed: list[LayerLoad] = []
        dropped: list[Node] = []
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
            dropped.append(n)
            if load not in failed:
                failed.append(load)
        for n in dropped:  # its host copy may have been evicted since the load started
            if n.host_page is None and not self._busy(n):
                self._detach(n)
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
        """Free the device pages of `nodes` (unreferenced leaves), backing up first those
        with no host copy; a node left with no copy at all leaves the tree."""
        if self.hicache is not None:
            self._back_up([n for n in nodes if n.host_page is None])
        self.allocator.free([n.device_page for n in nodes if n.device_page is not None])
        for n in nodes:
            n.device_page, n.load = None, None
        for n in nodes:  # the backup may have evicted host copies of the others
            if n.host_page is None and not self._busy(n):
                self._detach(n)

    def _back_up(self, nodes: list[Node]) -> None:
        """Copy `nodes` to new host pages; if pinned pages fill the host tier, they are not
        backed up (and are dropped, as without HiCache)."""
        assert self.hicache is not None
        if not nodes:
            return
        try:
            host_pages = self.hicache.backup([n.device_page for n in nodes])  # type: ignore[misc]
        except HostPoolFull:
            return
        for n, hp in zip(nodes, host_pages, strict=True):
            self._set_host(n, hp)

    def _host_evicted(self, host_pages: list[int]) -> None:
        """The host tier dropped these pages (LRU, never a pinned one: no referenced node's):
        forget them; drop nodes left nowhere."""
        nodes = [self._by_host.pop(hp) for hp in host_pages if hp in self._by_host]
        for node in nodes:
            node.host_page = None
        for node in nodes:
            if node.device_page is None and not self._busy(node):
                self._detach(node)

    def _busy(self, node: Node) -> bool:
        """Whether a request holds `node` or a node below it, or a load still copies into or
        out of one of their pages (on CUDA a load's host pages stay pinned until its copy
        has ended, after it reports done): such a subtree stays in the tree (a node left
        without pages only stops matches there) and keeps its pages."""
        stack = [node]
        while stack:
            n = stack.pop()
            if n.refs or (n.load is not None and not n.load.done()) or self._host_pinned(n):
                return True
            stack.extend(n.children.values())
        return False

    def _host_pinned(self, node: Node) -> bool:
        if self.hicache is None or node.host_page is None:
            return False
        return self.hicache.host.pinned(node.host_page)

    def _detach(self, node: Node) -> None:
        """Remove a node that holds no page, with its subtree, which nothing reaches any
        more: the subtree's pages are freed and forgotten, so that no node keeps naming a
        host page the host tier hands to another prefix next."""
        if node.parent is not None:
            node.parent.children.pop(node.key, None)
            node.parent = None
        stack = list(node.children.values())
        while stack:
            n = stack.pop()
            stack.extend(n.children.values())
            self._drop_host_copy(n)
            if n.device_page is not None:
                self.allocator.free([n.device_page])
                n.device_page, n.load = None, None

    def _drop_host_copy(self, node: Node) -> None:
        """Free `node`'s host page (unless the host tier already took it back) and forget it."""
        hp, node.host_page = node.host_page, None
        if hp is not None and self._by_host.get(hp) is node:
            del self._by_host[hp]
            assert self.hicache is not None
            self.hicache.host.free([hp])

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
