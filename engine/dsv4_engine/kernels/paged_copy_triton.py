"""Page copy with an optional per-page checksum as a Triton kernel (reference:
paged_copy_ref.py).  A few pages per program; rows may be strided (host `page_first` layout).

On CUDA the kernel runs on the device of `dst` (of `buf` for checksums); `src` may be
pinned host memory, read in place over the bus (what the transfer controller's loads do:
no staging copy), and the row indices are moved to the kernel's device.
"""

# Triton reads kernel parameter annotations (tl.constexpr marks compile-time constants);
# tensor and scalar parameters must stay unannotated.
# ruff: noqa: ANN001, ANN201, ANN202

import torch
import triton
import triton.language as tl

from dsv4_engine.kernels.paged_copy_ref import CHECKSUM_PERIOD, check_row_bytes

COPY_ROWS = 4  # pages per program
COPY_BLOCK = 2048  # bytes of each page per loop step


@triton.jit
def copy_kernel(
    src_ptr, src_rows_ptr, src_stride, dst_ptr, dst_rows_ptr, dst_stride, n, row_bytes, sum_ptr,
    WRITE: tl.constexpr, CHECKSUM: tl.constexpr, PERIOD: tl.constexpr, ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    i = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live = i < n
    src_row = tl.load(src_rows_ptr + i, mask=live, other=0).to(tl.int64)
    dst_row = tl.load(dst_rows_ptr + i, mask=live, other=0).to(tl.int64)
    total = tl.zeros((ROWS,), dtype=tl.int64)
    for start in range(0, row_bytes, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = live[:, None] & (offs < row_bytes)[None, :]
        data = tl.load(src_ptr + src_row[:, None] * src_stride + offs[None, :], mask=mask, other=0)
        if WRITE:
            tl.store(dst_ptr + dst_row[:, None] * dst_stride + offs[None, :], data, mask=mask)
        if CHECKSUM:
            weight = (offs % PERIOD + 1).to(tl.int64)
            total += tl.sum(data.to(tl.int64) * weight[None, :], axis=1)
    if CHECKSUM:
        tl.store(sum_ptr + i, total, mask=live)


def _check_rows(name: str, t: torch.Tensor) -> None:
    if t.dim() != 2 or t.dtype != torch.uint8 or t.stride(1) != 1:
        raise ValueError(f"{name}: expected a uint8 [rows, row_bytes] view with unit column stride")


def _launch(
    src: torch.Tensor,
    src_rows: torch.Tensor,
    dst: torch.Tensor | None,
    dst_rows: torch.Tensor | None,
    checksum: bool,
) -> torch.Tensor | None:
    _check_rows("src", src)
    target = src if dst is None else dst
    device = target.device
    n = src_rows.numel()
    sums = torch.empty(n, dtype=torch.int64, device=device) if checksum else None
    if n == 0:
        return sums
    rows = src_rows.to(device=device, dtype=torch.int64).contiguous()
    out_rows = rows if dst_rows is None else dst_rows.to(device, torch.int64).contiguous()
    copy_kernel[(triton.cdiv(n, COPY_ROWS),)](
        src, rows, src.stride(0), target, out_rows, target.stride(0), n, src.shape[1],
        sums if sums is not None else rows, WRITE=dst is not None, CHECKSUM=checksum,
        PERIOD=CHECKSUM_PERIOD, ROWS=COPY_ROWS, BLOCK=COPY_BLOCK,
    )  # fmt: skip
    return sums


def copy_pages(
    src: torch.Tensor,
    src_rows: torch.Tensor,
    dst: torch.Tensor,
    dst_rows: torch.Tensor,
    checksum: bool = False,
) -> torch.Tensor | None:
    _check_rows("dst", dst)
    check_row_bytes(src, dst)
    return _launch(src, src_rows, dst, dst_rows, checksum)


def page_checksums(buf: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    sums = _launch(buf, rows, None, None, checksum=True)
    assert sums is not None
    return sums
