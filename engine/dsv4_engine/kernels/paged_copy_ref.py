"""Page copy between host layout and device pages, with a per-page checksum: torch reference.

Both sides are 2-D uint8 views `[rows, row_bytes]` whose rows may be strided (a host
`page_first` page holds every layer, so one layer's segment is a strided column slice).
Gather (device → host) and scatter (host → device) are the same copy with the roles swapped.
The checksum weights each byte by its position, so a swapped or shifted byte changes it.
"""

from __future__ import annotations

import torch

CHECKSUM_PERIOD = 255  # byte i is weighted by (i % 255) + 1


def checksum_weights(row_bytes: int, device: torch.device) -> torch.Tensor:
    return torch.arange(row_bytes, device=device, dtype=torch.int64) % CHECKSUM_PERIOD + 1


def page_checksums(buf: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """int64 checksum of each listed row of `buf`."""
    data = buf[rows.to(torch.int64)].to(torch.int64)
    return (data * checksum_weights(buf.shape[1], buf.device)).sum(1)


def copy_pages(
    src: torch.Tensor,
    src_rows: torch.Tensor,
    dst: torch.Tensor,
    dst_rows: torch.Tensor,
    checksum: bool = False,
) -> torch.Tensor | None:
    """dst[dst_rows[i]] = src[src_rows[i]]; returns the copied rows' checksums if asked."""
    if src.shape[1] != dst.shape[1]:
        raise ValueError(f"row bytes differ: src {src.shape[1]} vs dst {dst.shape[1]}")
    rows = src[src_rows.to(torch.int64)]
    dst[dst_rows.to(torch.int64)] = rows.to(dst.device)
    if not checksum:
        return None
    return (rows.to(torch.int64) * checksum_weights(src.shape[1], rows.device)).sum(1)
