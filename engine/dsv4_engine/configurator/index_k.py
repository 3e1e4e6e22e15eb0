"""Bytes one compressed token's index key (index-K) occupies, per storage dtype.

The lightning indexer keeps one ``index_head_dim``-wide key per compressed token and
indexer layer.  Getting these bytes right is the whole point of the fixed configurator:
the seed's fork priced a bf16 key with the fp8 formula times the bf16 element size.
"""

from __future__ import annotations

from dsv4_engine.configurator.settings import EngineSettings
from dsv4_engine.features import IndexDtype

# fp8 keys carry one fp32 scale per block of this many elements (SGLang's quant_block_size).
FP8_SCALE_BLOCK = 128
# fp4 (e2m1) keys carry one 1-byte scale per block of this many elements.
FP4_SCALE_BLOCK = 32


def fp8_index_k_bytes(head_dim: int) -> int:
    """fp8 e4m3 payload plus one fp32 scale per 128-element block."""
    return head_dim + head_dim // FP8_SCALE_BLOCK * 4


def index_k_bytes_per_token(head_dim: int, dtype: IndexDtype, *, legacy: bool = False) -> int:
    """Bytes per compressed token per indexer layer.

    ``legacy`` reproduces the seed's bug, which only bites bf16: the fp8 formula (keys plus
    scales) multiplied by the bf16 element size, i.e. scales bf16 keys do not have, twice.
    """
    if dtype is IndexDtype.FP8:
        return fp8_index_k_bytes(head_dim)
    if dtype is IndexDtype.FP4:
        return head_dim // 2 + head_dim // FP4_SCALE_BLOCK
    if legacy:
        return fp8_index_k_bytes(head_dim) * 2
    return head_dim * 2


def index_k_budget_bytes(head_dim: int, settings: EngineSettings) -> int:
    """Index-K bytes per key the sizing budgets (both model families).  fp4 is budgeted at
    the fp8 size unless ``fp4_budget == "exact"``, as SGLang 0.5.23 does on NVIDIA; the
    pool still allocates fp4 rows."""
    if settings.index_dtype is IndexDtype.FP4 and settings.fp4_budget == "fp8":
        return fp8_index_k_bytes(head_dim)
    return index_k_bytes_per_token(head_dim, settings.index_dtype, legacy=settings.legacy)
