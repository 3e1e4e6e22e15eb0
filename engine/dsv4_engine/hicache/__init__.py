"""HiCache: `host_pool` (the host tier), `transfer` (per-layer async loads, backups,
checksums) and `cache` (write policies, evict, load back).  `race` reproduces the seed's
index-K race against a no-HiCache reference.  Import from the modules.

How an engine uses pools + HiCache (the reference engine's contract):

    pool = DevicePool(shape, num_pages, IndexDtype.BF16)          # pools.device_pool
    cache = HiCache.build(pool, features.hicache, on_evict=drop)  # host LRU evictions -> drop
    pages = pool.allocator.allocate(n)                           # stale bytes, like a GPU
    locs = pool.entry_locs(layer, pages, num_tokens)
    pool.store_kv(layer, locs, kv); pool.store_index_k(layer, locs, keys)
    host_pages = cache.on_insert(pages)             # write_through: copied now, else None
    host_pages = cache.evict(pages, host_pages)     # device pages freed (backed up if needed)
    pages, load = cache.load_back(host_pages)       # async, one layer at a time
    pool.index_scores(layer, locs, q, w) / pool.read_index_k / pool.read_kv / ...
                                                    # each waits in pool.gate for `layer`
    load.wait_all(timeout_s)                        # optional; TransferFailed on a bad page
    pool.gate.discard(load)                         # after dropping a failed load's pages

Every device read goes through `DevicePool.buffer(layer, kind)`, the one gated accessor.
"""
