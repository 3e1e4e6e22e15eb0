"""One-shot GPU check of every Triton kernel of dsv4_engine.kernels (run it on a CUDA box).

For each kernel: native Triton vs the torch reference on realistic shapes (stores must be
bit-identical, reads identical, scores within float tolerance with the same top-k), then
its achieved bandwidth next to the card's measured device copy bandwidth (and host->device
pinned copy bandwidth, the ceiling of a HiCache load).  Exits 0 and says so when there is
no CUDA device; exits 1 if any correctness check fails.

    python bench/gpu_kernels_check.py
"""

from __future__ import annotations

import sys

import torch


def timed_ms(fn, repeat: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeat


def copy_bandwidths(nbytes: int = 1 << 30) -> tuple[float, float]:
    """(device->device, pinned host->device) copy bandwidth in GB/s (d2d counts read+write)."""
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    d2d = 2 * nbytes / timed_ms(lambda: b.copy_(a)) / 1e6
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    h2d = nbytes / timed_ms(lambda: a.copy_(host, non_blocking=True), 5) / 1e6
    return d2d, h2d


def check_index_k(dtype, tri, ref, rows: list, failures: list[str]) -> None:
    """Store, read and score kernels of one index-K dtype at a 1M-token context."""
    from dsv4_engine.index_k import index_key_format
    from dsv4_engine.kernels.indexer_ref import topk_entries

    entries, pages, heads = 32, 8192, 64  # 262144 compressed tokens
    gen = torch.Generator(device="cuda").manual_seed(0)
    fmt = index_key_format(dtype, 128)
    n = entries * pages
    buf = torch.zeros((pages, entries * fmt.bytes_per_token), dtype=torch.uint8, device="cuda")
    want = buf.clone()
    locs = torch.randperm(n, device="cuda", generator=gen)
    keys = torch.randn(n, 128, device="cuda", generator=gen) * 3
    q = torch.randn(heads, 128, device="cuda", generator=gen)
    w = torch.rand(heads, device="cuda", generator=gen)
    ref.store_index_k(want, locs, keys, fmt, entries)
    tri.store_index_k(buf, locs, keys, fmt, entries)
    stored = torch.equal(buf, want)
    if not stored:
        failures.append(f"store {dtype.value}: {(buf != want).sum().item()} bytes differ")
    key_bytes = n * fmt.bytes_per_token
    moved = key_bytes + n * 128 * 4  # index-K bytes + float32 keys in or out
    ms = timed_ms(lambda: tri.store_index_k(buf, locs, keys, fmt, entries))
    rows.append((f"index-K store {dtype.value}", stored, ms, moved / ms / 1e6))
    same = torch.equal(
        tri.read_index_k(buf, locs, fmt, entries), ref.read_index_k(buf, locs, fmt, entries)
    )
    if not same:
        failures.append(f"read {dtype.value}: differs from the reference")
    ms = timed_ms(lambda: tri.read_index_k(buf, locs, fmt, entries))
    rows.append((f"index-K read {dtype.value}", same, ms, moved / ms / 1e6))
    got = tri.index_scores(buf, locs, fmt, entries, q, w)
    exp = ref.index_scores(buf, locs, fmt, entries, q, w)
    close = torch.allclose(got, exp, rtol=1e-4, atol=1e-3)
    top_got, top_exp = topk_entries(got, 512).tolist(), topk_entries(exp, 512).tolist()
    overlap = len(set(top_got) & set(top_exp))
    if not close or overlap < 510:
        failures.append(f"scores {dtype.value}: allclose={close}, top-512 overlap {overlap}")
    ms = timed_ms(lambda: tri.index_scores(buf, locs, fmt, entries, q, w))
    rows.append((f"indexer scores {dtype.value}", close, ms, key_bytes / ms / 1e6))


def check_page_copy(tri, ref, rows: list, failures: list[str]) -> None:
    src = torch.randint(0, 256, (4096, 1 << 16), dtype=torch.uint8, device="cuda")
    dst, want = torch.zeros_like(src), torch.zeros_like(src)
    perm = torch.randperm(4096, device="cuda")
    for checksum in (False, True):
        sums = tri.copy_pages(src, perm, dst, perm, checksum)
        want_sums = ref.copy_pages(src, perm, want, perm, checksum)
        ok = torch.equal(dst, want) and (not checksum or torch.equal(sums, want_sums))
        if not ok:
            failures.append(f"page copy (checksum={checksum}): differs from the reference")
        ms = timed_ms(lambda c=checksum: tri.copy_pages(src, perm, dst, perm, c))
        name = "page copy + checksum" if checksum else "page copy"
        rows.append((name, ok, ms, 2 * src.numel() / ms / 1e6))


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_kernels_check: no CUDA device here; skipped (nothing was checked)")
        return 0
    from dsv4_engine.features import IndexDtype
    from dsv4_engine.kernels import get_ops

    ref, tri = get_ops("torch"), get_ops("triton")
    d2d, h2d = copy_bandwidths()
    print(f"device: {torch.cuda.get_device_name()}  copy d2d {d2d:.0f} GB/s, h2d {h2d:.1f} GB/s")
    failures: list[str] = []
    rows: list[tuple[str, bool, float, float]] = []
    for dtype in (IndexDtype.FP8, IndexDtype.BF16):
        check_index_k(dtype, tri, ref, rows, failures)
    check_page_copy(tri, ref, rows, failures)
    print(f"{'kernel':26} {'ok':5} {'ms':>8} {'GB/s':>8} {'% of d2d copy':>14}")
    for name, ok, ms, gbs in rows:
        print(f"{name:26} {str(ok):5} {ms:8.3f} {gbs:8.0f} {gbs / d2d * 100:13.0f}%")
    for failure in failures:
        print("FAIL", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
