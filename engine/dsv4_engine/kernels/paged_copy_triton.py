"""Page copy with an optional per-page checksum as a Triton kernel (reference:
paged_copy_ref.py).  One program per page; rows may be strided (host `page_first` layout).

On CUDA both sides must be device memory (or mapped pinned memory); the transfer controller
moves host pages with stream copies and uses these kernels for device-side gathers and the
checksum of what arrived.
"""

# Triton reads kernel parameter annotations (tl.constexpr marks compile-time constants);
# tensor and scalar parameters must stay unannotated.
# ruff: noqa: ANN001, ANN202

import torch
import triton
import triton.language as tl

from dsv4_engine.kernels.paged_copy_ref import CHECKSUM_PERIOD, check_row_bytes

COPY_BLOCK = 1024


@triton.jit
def _copy_kernel(
    src_ptr, src_rows_ptr, src_stride, dst_ptr, dst_rows_ptr, dst_stride, row_bytes, sum_ptr,
    WRITE: tl.constexpr, CHECKSUM: tl.constexpr, PERIOD: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    i = tl.program_id(0)
    src_row = tl.load(src_rows_ptr + i).to(tl.int64)
    acc = tl.zeros((BLOCK,), dtype=tl.int64)
    for start in range(0, row_bytes, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < row_bytes
        data = tl.load(src_ptr + src_row * src_stride + offs, mask=mask, other=0)
        if WRITE:
            dst_row = tl.load(dst_rows_ptr + i).to(tl.int64)
            tl.store(dst_ptr + dst_row * dst_stride + offs, data, mask=mask)
        if CHECKSUM:
            acc += data.to(tl.int64) * (offs % PERIOD + 1).to(tl.int64)
    if CHECKSUM:
        tl.store(sum_ptr + i, tl.sum(acc, axis=0))


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
    n = src_rows.numel()
    sums = torch.empty(n, dtype=torch.int64, device=src.device) if checksum else None
    if n == 0:
        return sums
    rows = src_rows.to(device=src.device, dtype=torch.int64).contiguous()
    out_rows = rows if dst_rows is None else dst_rows.to(src.device, torch.int64).contiguous()
    target = src if dst is None else dst
    _copy_kernel[(n,)](
        src, rows, src.stride(0), target, out_rows, target.stride(0), src.shape[1],
        sums if sums is not None else rows,
        WRITE=dst is not None, CHECKSUM=checksum, PERIOD=CHECKSUM_PERIOD, BLOCK=COPY_BLOCK,
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
