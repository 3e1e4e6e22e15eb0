"""HiCache: `host_pool` (the host tier), `transfer` (per-layer async loads, backups,
checksums) and `cache` (write policies, evict, load back).  `race` reproduces the seed's
index-K race against a no-HiCache reference.  Import from the modules.
"""
