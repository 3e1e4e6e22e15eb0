"""Paged DSV4 device pools: `layout` (byte formulas), `allocator` (pages), `gate` (the
per-layer transfer gate) and `device_pool` (the buffers, reachable only through the gate).

Import from the modules; this package imports nothing so that `kernels` can use `layout`
without a cycle.
"""
