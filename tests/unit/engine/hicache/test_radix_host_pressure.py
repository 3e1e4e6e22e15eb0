"""The prefix cache under host-tier pressure: a page a request matched is never evicted from
the host tier, reused or handed to another prefix before the request has loaded it.

Each page of these trees holds a tag (its token), written into every byte of every segment
when a request computes it, so a page that came back holding another prefix's bytes is
seen at once.  The admission mirrors the engine's (`Engine._admit`): match, acquire, then
the fresh pages; one load for the whole batch; wait for it; read.  The small host tiers
(just above the device pool) make a device eviction's backup evict host pages too.
"""

from __future__ import annotations

import random

import pytest
import torch

from dsv4_engine.features import HiCacheWritePolicy, IndexDtype
from dsv4_engine.hicache.cache import HiCache
from dsv4_engine.hicache.host_pool import HostPool
from dsv4_engine.hicache.transfer import TransferController
from dsv4_engine.pools.allocator import OutOfPages
from dsv4_engine.pools.device_pool import DevicePool
from dsv4_engine.pools.layout import TINY_SHAPE
from dsv4_engine.reference.radix import Node, RadixCache

PAGE = TINY_SHAPE.page_size
LOAD_TIMEOUT_S = 30.0


class Tree:
    """A RadixCache over a real device pool and host tier, driven as the engine drives it."""

    def __init__(self, device_pages: int, host_pages: int, policy: str) -> None:
        pool = DevicePool(TINY_SHAPE, device_pages, IndexDtype.FP8, ungated_index_k=False)
        host = HostPool(pool.layout, host_pages)
        self.hicache = HiCache(pool, host, TransferController(pool, host), policy)
        self.pool = pool
        self.radix = RadixCache(pool.allocator, PAGE, self.hicache)

    def close(self) -> None:
        self.hicache.close()

    def write(self, page: int, tag: int) -> None:
        for seg in self.pool.layout.segments:
            self.pool.buffer(seg.layer, seg.kind)[page] = tag

    def tags(self, page: int) -> set[int]:
        """Every byte value page `page` holds, over every segment."""
        return {
            int(v)
            for seg in self.pool.layout.segments
            for v in torch.unique(self.pool.buffer(seg.layer, seg.kind)[page])
        }

    def reserve(self, prompt: list[int]) -> tuple[list[Node], list[Node], list[int]]:
        """(matched nodes, those to load, the whole prompt's pages), as `Engine._reserve`."""
        tokens = [t for tag in prompt for t in [tag] * PAGE]
        nodes = self.radix.match(tokens, len(prompt))
        on_host = self.radix.acquire(nodes)
        try:
            self.radix.ensure_free(len(prompt) - len(nodes))
            fresh = self.pool.allocator.allocate(len(prompt) - len(nodes))
        except OutOfPages:
            for n in on_host:
                self.pool.allocator.free([n.device_page])
                n.device_page = None
            self.radix.release(nodes)
            raise
        return nodes, on_host, [n.device_page for n in nodes] + fresh

    def run(self, prompts: list[list[int]]) -> list[list[int]]:
        """Admit `prompts` as one batch (those that fit), load, then check every matched
        page holds its own tag, compute the rest, insert and release.  Returns the prompts
        admitted."""
        admitted, to_load = [], []
        for prompt in prompts:
            try:
                nodes, on_host, pages = self.reserve(prompt)
            except OutOfPages:
                break
            admitted.append((prompt, nodes, pages))
            to_load += on_host
        self.radix.load(to_load)
        for node in to_load:
            node.load.wait_all(LOAD_TIMEOUT_S)
            assert node.load.finished_ok()
        check_invariants(self)
        for prompt, nodes, pages in admitted:
            for tag, page in zip(prompt[: len(nodes)], pages, strict=False):
                assert self.tags(page) == {tag}, f"page {page} of prefix tag {tag}"
            for tag, page in zip(prompt[len(nodes) :], pages[len(nodes) :], strict=True):
                self.write(page, tag)
        for prompt, nodes, pages in admitted:
            tokens = [t for tag in prompt for t in [tag] * PAGE]
            spare = self.radix.insert(tokens, pages)
            self.radix.release(nodes)
            self.pool.allocator.free(spare)
        check_invariants(self)
        return [prompt for prompt, _, _ in admitted]


def tree_nodes(radix: RadixCache) -> list[Node]:
    out, stack = [], list(radix.root.children.values())
    while stack:
        n = stack.pop()
        stack.extend(n.children.values())
        out.append(n)
    return out


def check_invariants(tree: Tree) -> None:
    """Every page in the tree is held by one node only; every host page a node names is
    allocated in the host tier and mapped back to that node; referenced nodes keep the
    host copy they have (pinned)."""
    host = tree.hicache.host
    nodes = tree_nodes(tree.radix)
    device = [n.device_page for n in nodes if n.device_page is not None]
    assert len(device) == len(set(device))
    on_host = [n.host_page for n in nodes if n.host_page is not None]
    assert len(on_host) == len(set(on_host))
    for n in nodes:
        if n.host_page is not None:
            assert n.host_page in host._lru, "a node names a freed host page"
            assert tree.radix._by_host.get(n.host_page) is n, "a host page has another owner"
            if n.refs:
                assert host._pins[n.host_page] > 0, "a referenced node's host page is evictable"


@pytest.fixture
def make_tree():
    trees: list[Tree] = []

    def make(device_pages: int, host_pages: int, policy: str = "write_back") -> Tree:
        tree = Tree(device_pages, host_pages, policy)
        trees.append(tree)
        return tree

    yield make
    for tree in trees:
        tree.close()


def _host_only_prefix_oldest_on_host(make_tree) -> Tree:
    """4 device pages, 5 host pages: prefix [1, 2] on host only and its pages the least
    recently used there, the host tier full, the device full of [6..9] with no host copy."""
    tree = make_tree(4, 5)
    tree.run([[1, 2]])
    tree.radix.offload_all()
    tree.run([[3, 4, 5]])
    tree.radix.offload_all()
    tree.run([[6, 7, 8, 9]])
    assert tree.hicache.host.free_pages == 0 and tree.pool.allocator.free_pages == 0
    return tree


def test_a_matched_host_prefix_survives_the_eviction_its_own_load_needs(make_tree):
    """Matching [1, 2] needs 2 device pages: evicting [9] and [8] backs them up, which needs
    2 host pages, and the least recently used are [1, 2]'s own.  They are the request's:
    the backup must take [3, 4, 5]'s instead (before: `load` asserted on a node whose host
    copy was gone, and its child's freed host page held [8]'s bytes)."""
    tree = _host_only_prefix_oldest_on_host(make_tree)
    assert tree.run([[1, 2]]) == [[1, 2]]
    assert tree.radix.match([1] * PAGE + [2] * PAGE, 2)[1].device_page is not None


def test_a_batch_neighbour_cannot_evict_a_prefix_matched_but_not_yet_loaded(make_tree):
    """One admission batch: the first request matches [1] (host only) and gets a device
    page for it; the second needs fresh pages, whose eviction backs pages up to the host
    tier.  The first request's host copy must still be there when the batch's load starts."""
    tree = make_tree(4, 5)
    tree.run([[1, 2]])
    tree.radix.offload_all()
    tree.run([[3, 4, 5]])
    tree.radix.offload_all()
    tree.run([[6, 7]])
    assert tree.run([[1, 2], [10, 11]]) == [[1, 2], [10, 11]]


def test_a_subtree_dropped_from_the_host_tier_forgets_its_pages(make_tree):
    """A host-only node evicted from the host tier takes its subtree with it: the children's
    host pages are freed *and forgotten*, so no node names a page another prefix reuses."""
    tree = make_tree(4, 5)
    tree.run([[1, 2, 3]])
    tree.radix.offload_all()
    parent = tree.radix.match([1] * PAGE, 1)[0]
    child = next(iter(parent.children.values()))
    tree.hicache.host.touch([child.host_page])  # the parent is evicted first
    tree.run([[4, 5, 6, 7]])
    tree.radix.offload_all()  # backing [4..7] up needs the parent's host page
    assert parent.host_page is None and child.host_page is None
    check_invariants(tree)


@pytest.mark.parametrize(
    "policy", [HiCacheWritePolicy.WRITE_BACK, HiCacheWritePolicy.WRITE_THROUGH]
)
@pytest.mark.parametrize("seed", range(6))
def test_random_batches_under_host_pressure_read_only_their_own_pages(make_tree, policy, seed):
    """Seeded batches of prompts over a few shared prefixes, offloads between some: every
    matched page holds its own prefix's bytes, and the bookkeeping stays consistent."""
    rng = random.Random(seed)
    tree = make_tree(6, 7, policy)
    roots = [[10 * r + 1, 10 * r + 2] for r in range(4)]
    suffix = iter(range(100, 256))
    for _ in range(30):
        batch = [rng.choice(roots)[: rng.randint(1, 2)] for _ in range(rng.randint(1, 3))]
        batch = [p + [next(suffix) for _ in range(rng.randint(0, 2))] for p in batch]
        tree.run(batch)
        if rng.random() < 0.3:
            tree.radix.offload_all()
            check_invariants(tree)
