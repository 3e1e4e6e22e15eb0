"""Triton kernels against their torch references.

Without CUDA the kernels run under Triton's CPU interpreter (TRITON_INTERPRET=1, set for
this module only): a correctness check on small shapes, not a speed measurement.  Stores
must agree bit for bit (a page written by one backend is read by the other); reads of the
same bytes too; scores to float tolerance (different summation order) and the same top-k.
"""

import os
import sys

import pytest
import torch

from dsv4_engine.features import IndexDtype
from dsv4_engine.index_k import index_key_format
from dsv4_engine.kernels import get_ops
from dsv4_engine.kernels.indexer_ref import topk_entries

TRITON_MODULES = ("dsv4_engine.kernels.index_k_triton", "dsv4_engine.kernels.paged_copy_triton")
ENTRIES = 32
REF = get_ops("torch")


@pytest.fixture(scope="module")
def triton_ops():
    """The Triton backend: native on CUDA, else decorated and run under the interpreter."""
    if torch.cuda.is_available():
        yield get_ops("triton")
        return
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"  # read when @triton.jit decorates and when it runs
    for name in TRITON_MODULES:
        sys.modules.pop(name, None)
    try:
        yield get_ops("triton")
    finally:
        for name in TRITON_MODULES:
            sys.modules.pop(name, None)
        if saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = saved


def _keys(n, d, seed):
    """Keys spanning 7 decades, plus rows that hit the fp8 edge cases."""
    gen = torch.Generator().manual_seed(seed)
    keys = torch.randn(n, d, generator=gen) * torch.logspace(-4, 3, n)[:, None]
    keys[0] = 0.0  # all-zero block: scale clamps, codes are zero
    keys[1] = 124.28  # rounds up across a binade (the interpreter's own cast gets this wrong)
    keys[1, 0] = 448.0
    keys[2] = torch.linspace(-1e-4, 1e-4, d)  # e4m3 subnormals after scaling
    keys[2, 0] = 1.0
    return keys


def _case(dtype, head_dim, seed=0, pages=3):
    fmt = index_key_format(dtype, head_dim)
    gen = torch.Generator().manual_seed(seed + 1)
    buf = torch.randint(
        0, 256, (pages, ENTRIES * fmt.bytes_per_token), dtype=torch.uint8, generator=gen
    )
    locs = torch.randperm(pages * ENTRIES, generator=gen)[:24]
    return fmt, buf, locs, _keys(len(locs), head_dim, seed)


@pytest.mark.parametrize("dtype", [IndexDtype.FP8, IndexDtype.BF16])
@pytest.mark.parametrize("head_dim", [128, 256])
def test_store_writes_the_same_bytes_as_the_reference(triton_ops, dtype, head_dim):
    fmt, buf, locs, keys = _case(dtype, head_dim)
    want = buf.clone()
    REF.store_index_k(want, locs, keys, fmt, ENTRIES)
    triton_ops.store_index_k(buf, locs, keys, fmt, ENTRIES)
    assert torch.equal(buf, want)


@pytest.mark.parametrize("dtype", [IndexDtype.FP8, IndexDtype.BF16])
def test_read_dequantizes_like_the_reference(triton_ops, dtype):
    fmt, buf, locs, keys = _case(dtype, 128, seed=4)
    REF.store_index_k(buf, locs, keys, fmt, ENTRIES)
    assert torch.equal(
        triton_ops.read_index_k(buf, locs, fmt, ENTRIES), REF.read_index_k(buf, locs, fmt, ENTRIES)
    )


@pytest.mark.parametrize("dtype", [IndexDtype.FP8, IndexDtype.BF16])
def test_indexer_scores_and_topk_match_the_reference(triton_ops, dtype):
    fmt, buf, locs, _ = _case(dtype, 128, seed=7)
    gen = torch.Generator().manual_seed(8)
    REF.store_index_k(buf, locs, torch.randn(len(locs), 128, generator=gen), fmt, ENTRIES)
    q = torch.randn(16, 128, generator=gen)
    w = torch.rand(16, generator=gen)
    got = triton_ops.index_scores(buf, locs, fmt, ENTRIES, q, w)
    want = REF.index_scores(buf, locs, fmt, ENTRIES, q, w)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-4)
    assert torch.equal(topk_entries(got, 8), topk_entries(want, 8))


def test_page_copy_and_checksums_match_the_reference_on_strided_rows(triton_ops):
    gen = torch.Generator().manual_seed(9)
    host = torch.randint(0, 256, (6, 3000), dtype=torch.uint8, generator=gen)
    segment = host[:, 1000:2500]  # one layer's segment of page_first host pages: strided rows
    src_rows, dst_rows = torch.tensor([5, 1, 3]), torch.tensor([0, 3, 2])
    got = torch.zeros(4, 1500, dtype=torch.uint8)
    want = got.clone()
    got_sums = triton_ops.copy_pages(segment, src_rows, got, dst_rows, checksum=True)
    want_sums = REF.copy_pages(segment, src_rows, want, dst_rows, checksum=True)
    assert torch.equal(got, want) and torch.equal(got_sums, want_sums)
    assert torch.equal(triton_ops.page_checksums(got, dst_rows), want_sums)
    got[3, 700] ^= 1
    assert triton_ops.page_checksums(got, dst_rows)[1] != want_sums[1]


def test_reference_checksum_sees_a_swap_of_two_bytes():
    page = torch.arange(600, dtype=torch.int64).remainder(251).to(torch.uint8)[None]
    swapped = page.clone()
    swapped[0, [10, 20]] = swapped[0, [20, 10]]
    rows = torch.tensor([0])
    assert REF.page_checksums(page, rows) != REF.page_checksums(swapped, rows)
