"""HiCache: the device pool plus a host tier, with a write policy deciding when pages are
copied to host.

The engine's prefix cache owns the bookkeeping (which tokens live in which pages); this
class owns the moves: back up on insert (`write_through`), on eviction (`write_back`), or
on the second hit (`write_through_selective`); evict device pages to host; load host pages
back through the gated per-layer loader.
"""

from __future__ import annotations

from collections.abc import Callable

from dsv4_engine.features import HiCacheFeature, HiCacheWritePolicy
from dsv4_engine.hicache.host_pool import GIB, HostPool, host_capacity_pages
from dsv4_engine.hicache.transfer import TransferController, TransferFault
from dsv4_engine.pools.device_pool import DevicePool
from dsv4_engine.pools.gate import LayerLoad

SELECTIVE_MIN_HITS = 2


class HiCache:
    def __init__(
        self,
        pool: DevicePool,
        host: HostPool,
        controller: TransferController,
        write_policy: HiCacheWritePolicy = HiCacheWritePolicy.WRITE_THROUGH,
    ) -> None:
        self.pool = pool
        self.host = host
        self.controller = controller
        self.write_policy = HiCacheWritePolicy(write_policy)

    @classmethod
    def build(
        cls,
        pool: DevicePool,
        feature: HiCacheFeature,
        *,
        bandwidth_bytes_per_s: float | None = None,
        layer_latency_s: float = 0.0,
        verify_checksums: bool = True,
        on_evict: Callable[[list[int]], None] | None = None,
    ) -> HiCache:
        """A HiCache sized and configured from the shared `features.hicache` flags."""
        size = feature.size_gb * GIB if feature.size_gb is not None else None
        pages = host_capacity_pages(pool.layout, pool.allocator.num_pages, feature.ratio, size)
        host = HostPool(
            pool.layout,
            pages,
            feature.mem_layout,
            pin_memory=pool.device.type == "cuda",
            on_evict=on_evict,
        )
        controller = TransferController(
            pool,
            host,
            bandwidth_bytes_per_s=bandwidth_bytes_per_s,
            layer_latency_s=layer_latency_s,
            verify_checksums=verify_checksums,
        )
        return cls(pool, host, controller, feature.write_policy)

    def backup(self, device_pages: list[int]) -> list[int]:
        """Copy device pages to newly allocated host pages (may evict LRU host pages)."""
        host_pages = self.host.allocate(len(device_pages))
        self.controller.backup(device_pages, host_pages)
        return host_pages

    def on_insert(self, device_pages: list[int], hits: int = 1) -> list[int] | None:
        """Pages just entered the prefix cache: host copies now if the policy says so."""
        if self.write_policy is HiCacheWritePolicy.WRITE_BACK:
            return None
        if self.write_policy is HiCacheWritePolicy.WRITE_THROUGH_SELECTIVE and (
            hits < SELECTIVE_MIN_HITS
        ):
            return None
        return self.backup(device_pages)

    def evict(self, device_pages: list[int], host_pages: list[int] | None) -> list[int]:
        """Free device pages, backing them up first unless `host_pages` already hold them."""
        if host_pages is None:
            host_pages = self.backup(device_pages)
        elif len(host_pages) != len(device_pages):
            raise ValueError(
                f"evict: {len(device_pages)} device pages vs {len(host_pages)} host pages"
            )
        self.pool.allocator.free(device_pages)
        return host_pages

    def load_back(
        self, host_pages: list[int], fault: TransferFault | None = None
    ) -> tuple[list[int], LayerLoad]:
        """Allocate device pages and start loading host pages into them, layer by layer.

        Reads of the returned pages wait in the pool's gate until their layer has landed.
        """
        device_pages = self.pool.allocator.allocate(len(host_pages))
        self.host.touch(host_pages)
        return device_pages, self.controller.load(host_pages, device_pages, fault)

    def close(self) -> None:
        self.controller.close()
