"""Host memory a HiCache tier needs: the operator sizes pod memory requests from it.

SGLang 0.5.23 mirrors every device pool page for page on the host: with a ratio, each
host pool has ``int(device_pages * ratio)`` pages of the device page's bytes (SWA and the
c4 compress state counted in SWA pages, c4 / c4 index-K / c128 in full pages).  With an
explicit size the host pool is that size.
"""

from __future__ import annotations

import math

from dsv4_engine.configurator.budget import GiB
from dsv4_engine.configurator.dsv4 import dsv4_geometry, v4_page_bytes
from dsv4_engine.configurator.errors import ConfigError
from dsv4_engine.configurator.model import ModelKind, ModelSpec
from dsv4_engine.configurator.result import PoolPlan
from dsv4_engine.configurator.settings import EngineSettings


def _dsv4_host_bytes(
    model: ModelSpec, settings: EngineSettings, plan: PoolPlan, ratio: float
) -> int:
    page = settings.page_size
    geo = dsv4_geometry(model, settings)
    full_pages = int(math.ceil(plan.full_tokens / page) * ratio)
    swa_pages = int(math.ceil(plan.pool("swa").tokens / page) * ratio)
    # The MTP draft's SWA layer rides in the SWA host pool.
    swa_layers = geo.n_layers + (1 if settings.speculative else 0)
    per_full_page = (
        geo.n_c4 * v4_page_bytes(model, page // 4)
        + geo.n_c4 * page // 4 * geo.index_k_alloc
        + geo.n_c128 * v4_page_bytes(model, page // 128)
    )
    per_swa_page = swa_layers * v4_page_bytes(model, page) + geo.ring4 * geo.c4_state_row_bytes
    return full_pages * per_full_page + swa_pages * per_swa_page


def host_bytes_for_size(size_gb: float) -> int:
    """An explicit host pool size, GiB per rank.  (SGLang 0.5.23 refuses --hicache-size for
    DeepSeek-V4; there a launcher must turn it into a ratio.)"""
    if size_gb <= 0:
        raise ConfigError(f"hicache size: expected a positive size in GiB, got {size_gb}")
    return int(size_gb * GiB)


def host_bytes_for_plan(
    model: ModelSpec, settings: EngineSettings, plan: PoolPlan, ratio: float
) -> int:
    """Host bytes per rank mirroring a device plan at ``ratio`` times its pages."""
    if ratio <= 1:
        raise ConfigError(f"hicache ratio: expected a value greater than 1, got {ratio}")
    if model.kind is ModelKind.DSV4:
        return _dsv4_host_bytes(model, settings, plan, ratio)
    per_token = sum(p.bytes_per_token for p in plan.pools)
    return int(int(plan.full_tokens * ratio) * per_token)
