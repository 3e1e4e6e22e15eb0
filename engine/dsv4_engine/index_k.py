"""Index-K storage: the bytes of one compressed token's index key per dtype, and which
engine stores which dtype.

The one rule the pool sizing (`configurator`), the paged pools and kernels (`pools`,
`kernels`) and the SGLang plugin share, so a key cannot take 132 bytes in one place and
256 in another.  Pure Python: the operator imports it without torch.

- fp8: e4m3 keys plus one fp32 scale per 128 elements (SGLang's `quant_block_size`):
  d + d/128*4 = 132 B at d = 128 (SGLang 0.5.23 `get_dsv4_indexer_bytes_per_token`).
- fp4: MXFP4, e2m1 nibbles plus one e8m0 byte per 32 elements: d/2 + d/32 = 68 B
  (SGLang's `--enable-deepseek-v4-fp4-indexer`).
- bf16: raw keys, 2*d = 256 B, no scales.  This is the seed fork's layout: SGLang 0.5.23's
  DeepSeek-V4 indexer pool is `uint8` and stores fp8 or fp4 rows only, so only the CPU
  reference engine stores bf16 (to reproduce the incident).

On a page all keys come first, then all scales (SGLang's `IndexKeyCache` layout).
"""

from __future__ import annotations

from dataclasses import dataclass

from dsv4_engine.features import IndexDtype

FP8_BLOCK = 128  # elements per fp32 scale of fp8 index-K (SGLang's quant_block_size)
FP4_BLOCK = 32  # elements per one-byte (e8m0) scale of fp4 index-K
SGLANG_VERSION = "0.5.23"
# What SGLang's DeepSeek-V4 indexer pool stores (its buffer is uint8: fp8 or fp4 rows).
SGLANG_INDEX_DTYPES = (IndexDtype.FP8, IndexDtype.FP4)
_LAYOUTS = {
    IndexDtype.FP8: "fp8 e4m3 keys + fp32 scale per 128",
    IndexDtype.FP4: "fp4 e2m1 keys + e8m0 scale per 32",
    IndexDtype.BF16: "bf16 keys, no scales",
}


@dataclass(frozen=True)
class IndexKeyFormat:
    """Per compressed token: `key_bytes` of keys and `scale_bytes` of block scales."""

    dtype: IndexDtype
    head_dim: int
    key_bytes: int
    scale_bytes: int

    @property
    def bytes_per_token(self) -> int:
        return self.key_bytes + self.scale_bytes

    def describe(self) -> str:
        """e.g. '132 B (fp8 e4m3 keys + fp32 scale per 128)'."""
        return f"{self.bytes_per_token} B ({_LAYOUTS[self.dtype]})"


def index_key_format(dtype: IndexDtype, head_dim: int) -> IndexKeyFormat:
    """The storage format of one index key; ValueError for a head_dim it cannot hold."""
    dtype = IndexDtype(dtype)
    if dtype is IndexDtype.FP8:
        _require_multiple(head_dim, FP8_BLOCK, "fp8 index-K")
        return IndexKeyFormat(dtype, head_dim, head_dim, head_dim // FP8_BLOCK * 4)
    if dtype is IndexDtype.FP4:
        _require_multiple(head_dim, FP4_BLOCK, "fp4 index-K")
        return IndexKeyFormat(dtype, head_dim, head_dim // 2, head_dim // FP4_BLOCK)
    _require_multiple(head_dim, 1, "bf16 index-K")
    return IndexKeyFormat(dtype, head_dim, 2 * head_dim, 0)


def index_k_bytes_per_token(dtype: IndexDtype, head_dim: int) -> int:
    """Bytes one compressed token's key takes in an indexer layer's pool."""
    return index_key_format(dtype, head_dim).bytes_per_token


def sglang_index_dtype_error(dtype: IndexDtype) -> str | None:
    """Why SGLang cannot run index-K `dtype` (one line naming indexDtype), or None."""
    dtype = IndexDtype(dtype)
    if dtype in SGLANG_INDEX_DTYPES:
        return None
    d = 128  # DeepSeek-V4's index_head_dim, for the byte counts in the message
    return (
        f"indexDtype {dtype.value}: SGLang {SGLANG_VERSION} stores DeepSeek-V4 index-K only as "
        f"fp8 ({index_k_bytes_per_token(IndexDtype.FP8, d)} B per key) or fp4 "
        f"({index_k_bytes_per_token(IndexDtype.FP4, d)} B, --enable-deepseek-v4-fp4-indexer); "
        f"{dtype.value} ({index_k_bytes_per_token(dtype, d)} B) exists only in the CPU "
        "reference engine (engine: reference)"
    )


def _require_multiple(value: int, multiple: int, what: str) -> None:
    if not isinstance(value, int) or value <= 0 or value % multiple:
        raise ValueError(
            f"index_head_dim={value!r}: {what} needs a positive multiple of {multiple}"
        )
