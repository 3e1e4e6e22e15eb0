"""dsv4-engine: what runs inside the engine image (pool sizing, HiCache, kernels, plugin)."""
