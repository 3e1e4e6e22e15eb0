"""Page copy between host layout and device pages, with a per-page checksum: torch reference.

Both sides are 2-D uint8 views `[rows, row_bytes]` whose rows may be strided (a host
`page_first` page holds every layer, so one layer's segment is a strided column slice).
Gather (device → host) and scatter (host → device) are the same copy with the roles swapped.
The checksum weights each byte by its position, so a swapped or shifted byte changes it.
"""

from __future__ import annotations

import torch

CHECKSUM_PERIOD = 255  # byte i is weighted by (i % 255) + 1


def row_checksums(rows: torch.Tensor) -> torch.Tensor:
    """int64 checksum of each row of a uint8 `[n, row_bytes]` tensor."""
    weights = torch.arange(rows.shape[1], device=rows.device) % CHECKSUM_PERIOD + 1
    return (rows.to(torch.int64) * weights).sum(1)


def page_checksums(buf: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """int64 checksum of each listed row of `buf`."""
    return row_checksums(buf[rows.to(torch.int64)])


def check_row_bytes(src: torch.Tensor, dst: torch.Tensor) -> None:
    """A page copy moves whole rows: both sides must have the same row length."""
    if src.shape[1] != dst.shape[1]:
        raise ValueError(f"row bytes differ: src {src.shape[1]} vs dst {dst.shape[1]}")


def copy_pages(
    src: torch.Tensor,
    src_rows: torch.Tensor,
    dst: torch.Tensor,
    dst_rows: torch.Tensor,
    checksum: bool = False,
) -> torch.Tensor | None:
    """dst[dst_rows[i]] = src[src_rows[i]]; returns the copied rows' checksums if asked."""
    check_row_bytes(src, dst)
    rows = src[src_rows.to(src.device, torch.int64)]
    dst[dst_rows.to(dst.device, torch.int64)] = rows.to(dst.device)
    return row_checksums(rows) if checksum else None
