"""Byte layout of the DSV4 device KV pools: what one page holds for each layer.

Pool sizing (the configurator), the device pools, the host tier and the copy kernels must
agree to the byte, or a transfer moves the wrong bytes silently; so the formulas live here,
once, as plain functions of plain data (the bytes of one index key: `dsv4_engine.index_k`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dsv4_engine.features import IndexDtype
from dsv4_engine.index_k import IndexKeyFormat, index_key_format

KV_ELEMENT_BYTES = 2  # main KV is stored as bf16 in this engine
INDEXED_RATIO = 4  # only c4 layers carry a lightning indexer (and so index-K)


class BufferKind(StrEnum):
    """Every kind of per-layer device data.  Reads of each go through the one gate."""

    KV = "kv"
    INDEX_K = "index_k"
    COMPRESS_STATE = "compress_state"


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a DSV4-shaped model that decide the pools' bytes.

    `compress_ratios` has one entry per layer: 0 = sliding window (one KV entry per token),
    r > 0 = compressed (one entry per r tokens); ratio 4 layers also hold index-K.
    """

    compress_ratios: tuple[int, ...]
    kv_dim: int
    index_head_dim: int
    index_n_heads: int
    page_size: int

    def __post_init__(self) -> None:
        if not self.compress_ratios:
            raise ValueError("compress_ratios: expected at least one layer")
        for name in ("kv_dim", "index_head_dim", "index_n_heads", "page_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}={value!r}: expected a positive integer")
        for layer, ratio in enumerate(self.compress_ratios):
            if ratio < 0 or (ratio and self.page_size % ratio):
                raise ValueError(
                    f"compress_ratios[{layer}]={ratio}: expected 0 or a divisor of "
                    f"page_size={self.page_size}"
                )

    @property
    def num_layers(self) -> int:
        return len(self.compress_ratios)

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], page_size: int = 128) -> ModelShape:
        """A shape from a DSV4 `config.json`; the MTP layer's trailing ratio is dropped."""
        try:
            layers = int(config["num_hidden_layers"])
            ratios = tuple(int(r) for r in config["compress_ratios"][:layers])
            return cls(
                compress_ratios=ratios,
                kv_dim=int(config["head_dim"]),
                index_head_dim=int(config["index_head_dim"]),
                index_n_heads=int(config["index_n_heads"]),
                page_size=page_size,
            )
        except KeyError as missing:
            raise ValueError(f"config.json: missing field {missing}") from None


@dataclass(frozen=True)
class Segment:
    """One paged buffer of one layer: `page_bytes` bytes per page of `entries` entries."""

    layer: int
    kind: BufferKind
    entries: int
    page_bytes: int


@dataclass(frozen=True)
class PoolLayout:
    """Every paged segment of a page, layer by layer, in transfer order (KV, then index-K)."""

    shape: ModelShape
    index_format: IndexKeyFormat
    segments: tuple[Segment, ...]

    def layer_segments(self, layer: int) -> tuple[Segment, ...]:
        return tuple(s for s in self.segments if s.layer == layer)

    def segment(self, layer: int, kind: BufferKind) -> Segment:
        for s in self.segments:
            if s.layer == layer and s.kind is kind:
                return s
        raise KeyError(f"layer {layer} has no paged {kind.value} buffer")

    def layer_page_bytes(self, layer: int) -> int:
        return sum(s.page_bytes for s in self.layer_segments(layer))

    @property
    def page_bytes(self) -> int:
        """Bytes of one page over every layer: what one host page holds."""
        return sum(s.page_bytes for s in self.segments)


# DSV4-shaped and tiny (a sliding-window layer, then c4 / c128 / c4) with the real index
# head: what tests, the race reproduction and a CPU reference engine run on.
TINY_SHAPE = ModelShape(
    compress_ratios=(0, 4, 128, 4), kv_dim=32, index_head_dim=128, index_n_heads=16, page_size=128
)


def pool_layout(shape: ModelShape, index_dtype: IndexDtype) -> PoolLayout:
    fmt = index_key_format(index_dtype, shape.index_head_dim)
    segments: list[Segment] = []
    for layer, ratio in enumerate(shape.compress_ratios):
        entries = shape.page_size // ratio if ratio else shape.page_size
        kv_bytes = entries * shape.kv_dim * KV_ELEMENT_BYTES
        segments.append(Segment(layer, BufferKind.KV, entries, kv_bytes))
        if ratio == INDEXED_RATIO:
            segments.append(
                Segment(layer, BufferKind.INDEX_K, entries, entries * fmt.bytes_per_token)
            )
    return PoolLayout(shape, fmt, tuple(segments))
