"""The configurator's answer: what each pool costs and holds on one rank."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Pool:
    """One device pool: ``tokens`` entries (tokens, compressed tokens or state rows) of
    ``bytes_per_token`` bytes each, summed over the layers that own the pool."""

    name: str
    bytes_per_token: float
    tokens: int
    # Rows allocated beyond ``tokens`` (ring slack, padding to a whole block).
    reserved: int = 0

    @property
    def bytes(self) -> int:
        return int((self.tokens + self.reserved) * self.bytes_per_token)


@dataclass(frozen=True)
class PoolPlan:
    """Pool sizes for one rank, in SGLang's coefficient + bias model:
    ``kv_budget_bytes >= full_tokens * bytes_per_full_token + fixed_bytes``."""

    model_kind: str
    index_dtype: str
    # The engine the plan is for (sglang | reference) and what it stores per index key.
    engine: str
    index_k_storage: str
    legacy: bool
    page_size: int
    kv_budget_bytes: int
    # Coefficient: bytes one "full" (uncompressed, logical) token costs over all pools.
    bytes_per_full_token: float
    # Bias: request-scoped bytes that do not scale with tokens (c128 compress state,
    # a cap-mode SWA pool).
    fixed_bytes: int
    full_tokens: int
    max_running_requests_per_worker: int
    # Index-K bytes per compressed token and indexer layer: what the sizing budgets and
    # what the pool allocates (they differ for fp4 on NVIDIA, and in legacy mode).
    index_k_budget_bytes: int
    index_k_alloc_bytes: int
    swa_mode: str
    pools: tuple[Pool, ...]

    def pool(self, name: str) -> Pool:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["pools"] = [{**asdict(p), "bytes": p.bytes} for p in self.pools]
        return data
