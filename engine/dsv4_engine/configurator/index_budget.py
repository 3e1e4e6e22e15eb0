"""What the pool sizing budgets for one compressed token's index key.

The storage itself (bytes per key and dtype, which engine stores which) is one rule in
`dsv4_engine.index_k`; this module adds what SGLang 0.5.23's sizing does with it: fp4 is
budgeted at the fp8 size on NVIDIA (its pool still allocates fp4 rows), and the seed's
fork priced bf16 with the fp8 formula times the bf16 element size (`legacy`).
"""

from __future__ import annotations

from dsv4_engine.configurator.errors import ConfigError
from dsv4_engine.configurator.settings import EngineSettings
from dsv4_engine.engine_config import Backend
from dsv4_engine.features import IndexDtype
from dsv4_engine.index_k import SGLANG_VERSION, index_k_bytes_per_token, index_key_format

BF16_ELEMENT_BYTES = 2


def stored_index_k_bytes(head_dim: int, dtype: IndexDtype) -> int:
    """Bytes the pool allocates per key (`dsv4_engine.index_k`), model errors as ConfigError."""
    try:
        return index_k_bytes_per_token(dtype, head_dim)
    except ValueError as err:
        raise ConfigError(f"model config: {err}") from None


def legacy_bf16_index_k_bytes(head_dim: int) -> int:
    """The seed's bug: the fp8 formula (keys plus scales) times the bf16 element size."""
    return stored_index_k_bytes(head_dim, IndexDtype.FP8) * BF16_ELEMENT_BYTES


def index_k_budget_bytes(head_dim: int, settings: EngineSettings) -> int:
    """Index-K bytes per key the sizing budgets (both model families).  fp4 is budgeted at
    the fp8 size unless ``fp4_budget == "exact"``, as SGLang 0.5.23 does on NVIDIA; the
    pool still allocates fp4 rows."""
    if settings.index_dtype is IndexDtype.FP4 and settings.fp4_budget == "fp8":
        return stored_index_k_bytes(head_dim, IndexDtype.FP8)
    if settings.legacy and settings.index_dtype is IndexDtype.BF16:
        return legacy_bf16_index_k_bytes(head_dim)
    return stored_index_k_bytes(head_dim, settings.index_dtype)


def index_k_storage(head_dim: int, settings: EngineSettings) -> str:
    """Which engine stores what, per compressed token and indexer layer, for the plan."""
    stored = index_key_format(settings.index_dtype, head_dim).describe()
    if settings.legacy and settings.index_dtype is IndexDtype.BF16:
        return f"the seed's SGLang fork stores {stored}"
    if settings.engine is Backend.REFERENCE:
        return f"the CPU reference engine stores {stored}"
    return f"SGLang {SGLANG_VERSION} stores {stored}"
