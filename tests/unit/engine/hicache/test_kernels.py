"""Triton kernels against their torch references.

On CUDA the kernels run compiled, on CUDA tensors; without CUDA under Triton's CPU
interpreter (TRITON_INTERPRET=1, set for this module only), on CPU tensors: a correctness
check on small shapes, not a speed measurement.  The references run on the same tensors.
Stores must agree bit for bit (a page written by one backend is read by the other); reads
of the same bytes too; scores within the score kernel's SCORE_TOLERANCE (its dots take
bf16 inputs), with the same top-k.
"""

import pytest
import torch

from dsv4_engine.features import IndexDtype
from dsv4_engine.index_k import index_key_format
from dsv4_engine.kernels import get_ops

ENTRIES = 32
REF = get_ops("torch")


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


def _case(device, dtype, head_dim, seed=0, pages=3):
    fmt = index_key_format(dtype, head_dim)
    gen = torch.Generator().manual_seed(seed + 1)
    buf = torch.randint(
        0, 256, (pages, ENTRIES * fmt.bytes_per_token), dtype=torch.uint8, generator=gen
    )
    locs = torch.randperm(pages * ENTRIES, generator=gen)[:24]
    keys = _keys(len(locs), head_dim, seed)
    return fmt, buf.to(device), locs.to(device), keys.to(device)


@pytest.mark.parametrize("dtype", [IndexDtype.FP8, IndexDtype.BF16])
@pytest.mark.parametrize("head_dim", [128, 256])
def test_store_writes_the_same_bytes_as_the_reference(triton_ops, kernel_device, dtype, head_dim):
    fmt, buf, locs, keys = _case(kernel_device, dtype, head_dim)
    want = buf.clone()
    REF.store_index_k(want, locs, keys, fmt, ENTRIES)
    triton_ops.store_index_k(buf, locs, keys, fmt, ENTRIES)
    assert torch.equal(buf, want)


@pytest.mark.parametrize("dtype", [IndexDtype.FP8, IndexDtype.BF16])
def test_read_dequantizes_like_the_reference(triton_ops, kernel_device, dtype):
    fmt, buf, locs, keys = _case(kernel_device, dtype, 128, seed=4)
    REF.store_index_k(buf, locs, keys, fmt, ENTRIES)
    assert torch.equal(
        triton_ops.read_index_k(buf, locs, fmt, ENTRIES), REF.read_index_k(buf, locs, fmt, ENTRIES)
    )


def _scores_case(device, dtype, tokens, heads, head_dim=128):
    """(fmt, buf, locs, q, w): stored keys, and one step's indexer query."""
    fmt, buf, locs, _ = _case(device, dtype, head_dim, seed=7)
    gen = torch.Generator().manual_seed(8)
    keys = torch.randn(len(locs), head_dim, generator=gen)
    REF.store_index_k(buf, locs, keys.to(device), fmt, ENTRIES)
    q = torch.randn(tokens, heads, head_dim, generator=gen)
    w = torch.randn(tokens, heads, generator=gen)  # negative weights too, as the model's
    return fmt, buf, locs, q.to(device), w.to(device)


def _scores_match(got, want):
    # Imported here: the kernel module is imported under the interpreter by `triton_backend`.
    from dsv4_engine.kernels.index_k_triton import SCORE_TOLERANCE

    return torch.allclose(got, want, **SCORE_TOLERANCE)


@pytest.mark.parametrize("dtype", [IndexDtype.FP8, IndexDtype.BF16])
@pytest.mark.parametrize(
    ("tokens", "heads", "head_dim"),
    [(3, 4, 128), (70, 4, 128), (3, 16, 128), (1, 64, 128), (12, 24, 128), (3, 16, 256)],
)  # the reference engine's 4 heads, V4's 64, uneven ones, two fp8 scale blocks per key
def test_indexer_scores_and_topk_match_the_reference(
    triton_ops, kernel_device, dtype, tokens, heads, head_dim
):
    fmt, buf, locs, q, w = _scores_case(kernel_device, dtype, tokens, heads, head_dim)
    got = triton_ops.index_scores(buf, locs, fmt, ENTRIES, q, w)
    want = REF.index_scores(buf, locs, fmt, ENTRIES, q, w)
    assert got.shape == (tokens, len(locs))
    assert _scores_match(got, want)
    assert torch.equal(REF.topk(got, 8), REF.topk(want, 8))


@pytest.mark.parametrize("dtype", [IndexDtype.FP8, IndexDtype.BF16])
def test_the_score_tolerance_still_sees_another_tokens_query(triton_ops, kernel_device, dtype):
    fmt, buf, locs, q, w = _scores_case(kernel_device, dtype, 3, 64)
    want = REF.index_scores(buf, locs, fmt, ENTRIES, q, w)
    shifted = triton_ops.index_scores(buf, locs, fmt, ENTRIES, q.roll(1, 0), w)
    assert not _scores_match(shifted[1:], want[1:])


def test_the_score_tolerance_still_sees_one_scale_off_by_a_thousandth(triton_ops, kernel_device):
    fmt, buf, locs, q, w = _scores_case(kernel_device, IndexDtype.FP8, 3, 64)
    want = REF.index_scores(buf, locs, fmt, ENTRIES, q, w)
    page, slot = int(locs[5]) // ENTRIES, int(locs[5]) % ENTRIES
    scale = buf[page, ENTRIES * fmt.key_bytes :].view(torch.float32)[slot : slot + 1]
    scale *= 1.001
    got = triton_ops.index_scores(buf, locs, fmt, ENTRIES, q, w)
    assert _scores_match(got[:, :5], want[:, :5])
    assert not _scores_match(got[:, 5], want[:, 5])


@pytest.mark.parametrize(
    ("n", "k"), [(24, 8), (24, 24), (5, 3), (600, 37), (9000, 20)]
)  # one chunk, k = n, odd sizes, several chunks whose candidates take a second pass
def test_topk_kernel_picks_the_references_entries_in_order(triton_ops, kernel_device, n, k):
    gen = torch.Generator().manual_seed(n + k)
    scores = torch.randn(3, n, generator=gen)
    scores[0, ::3] = 0.25  # ties: the lower index first
    scores[1, 1::2] = float("-inf")  # masked entries, as the indexer masks unseen ones
    scores[2, :4] = torch.tensor([0.0, -0.0, 0.0, -0.0])  # -0.0 ties with 0.0
    scores = scores.to(kernel_device)
    assert torch.equal(triton_ops.topk(scores, k), REF.topk(scores, k))


def test_reference_topk_is_a_stable_descending_sort():
    gen = torch.Generator().manual_seed(11)
    scores = torch.randint(-3, 4, (4, 300), generator=gen).to(torch.float32) / 2  # many ties
    scores[0, ::7] = float("-inf")
    scores[1, ::5] = -0.0
    scores[2] = torch.randn(300, generator=gen) * 1e-30  # subnormal-small, both signs
    for k in (1, 16, 300):
        want = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :k]
        assert torch.equal(REF.topk(scores, k), want)


def test_topk_refuses_more_than_a_row_holds(triton_ops, kernel_device):
    for ops in (REF, triton_ops):
        with pytest.raises(ValueError, match="k=5 exceeds the 4 scores of a row"):
            ops.topk(torch.zeros(1, 4, device=kernel_device), 5)


def test_page_copy_and_checksums_match_the_reference_on_strided_rows(triton_ops, kernel_device):
    gen = torch.Generator().manual_seed(9)
    host = torch.randint(0, 256, (6, 3000), dtype=torch.uint8, generator=gen).to(kernel_device)
    segment = host[:, 1000:2500]  # one layer's segment of page_first host pages: strided rows
    src_rows = torch.tensor([5, 1, 3], device=kernel_device)
    dst_rows = torch.tensor([0, 3, 2], device=kernel_device)
    got = torch.zeros(4, 1500, dtype=torch.uint8, device=kernel_device)
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
