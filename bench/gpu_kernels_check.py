"""One-shot GPU check of dsv4_engine's kernels and its CUDA HiCache path (run it on a CUDA box).

1. Kernels: every Triton kernel of dsv4_engine.kernels against its torch reference on
   realistic shapes (stores bit-identical, reads identical, scores within the score
   kernel's SCORE_TOLERANCE for 4 and 64 heads and 1 or 16 query tokens, top-k identical on
   the same scores; the score kernel compiles once per dtype and head count, seconds each,
   whatever the token count), and
   each kernel's bandwidth next to the card's device copy bandwidth (and pinned
   host->device, the ceiling of a HiCache load).
2. The race on CUDA (hicache/race.py with device="cuda"): a batch HiCache load on the copy
   stream, unthrottled, while concurrent requests run their forward passes with GPU compute
   per layer.  Gated: 0 stale reads observed by the pool and every request equals its
   no-HiCache reference.  Ungated index-K: the pool observes stale reads (> 0).
3. Copy/compute overlap: a load alone, a forward pass alone, and both at once (the forward
   reading layer L while layer L+1 copies): how much of the shorter one the overlap hides.

Exits 0 when everything passed, 1 when a check failed, 2 when it cannot run (no CUDA
device): never 0 without having checked.

    python bench/gpu_kernels_check.py
"""

from __future__ import annotations

import sys
import time

import torch

NO_CUDA_EXIT = 2


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


# -- 1. kernels ---------------------------------------------------------------------------


def check_index_k(dtype, tri, ref, rows: list, failures: list[str]) -> None:
    """Store, read, score and top-k kernels of one index-K dtype at a 1M-token context."""
    from dsv4_engine.features import IndexDtype
    from dsv4_engine.index_k import index_key_format
    from dsv4_engine.kernels.index_k_triton import SCORE_TOLERANCE

    entries, pages = 32, 8192  # 262144 compressed tokens
    gen = torch.Generator(device="cuda").manual_seed(0)
    fmt = index_key_format(dtype, 128)
    n = entries * pages
    buf = torch.zeros((pages, entries * fmt.bytes_per_token), dtype=torch.uint8, device="cuda")
    want = buf.clone()
    locs = torch.randperm(n, device="cuda", generator=gen)
    keys = torch.randn(n, 128, device="cuda", generator=gen) * 3
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
    for tokens, heads in ((1, 64), (16, 64), (1, 4)):
        q = torch.randn(tokens, heads, 128, device="cuda", generator=gen)
        w = torch.rand(tokens, heads, device="cuda", generator=gen)
        got = tri.index_scores(buf, locs, fmt, entries, q, w)
        exp = ref.index_scores(buf, locs, fmt, entries, q, w)
        close = torch.allclose(got, exp, **SCORE_TOLERANCE)
        overlap = min(
            len(set(a.tolist()) & set(b.tolist()))
            for a, b in zip(ref.topk(got, 512), ref.topk(exp, 512), strict=True)
        )
        if not close or overlap < 510:
            failures.append(
                f"scores {dtype.value} T={tokens} H={heads}: allclose={close}, "
                f"top-512 overlap {overlap}"
            )
        ms = timed_ms(lambda q=q, w=w: tri.index_scores(buf, locs, fmt, entries, q, w))
        rows.append((f"scores {dtype.value} T={tokens} H={heads}", close, ms, key_bytes / ms / 1e6))
    scores = torch.randn(16, n, device="cuda", generator=gen)
    top_same = torch.equal(tri.topk(scores, 512), ref.topk(scores, 512))
    if not top_same:
        failures.append("top-512 of 16 x 262144 scores: differs from the reference")
    if dtype is IndexDtype.FP8:  # one timing of the dtype-independent top-k
        ms = timed_ms(lambda: tri.topk(scores, 512), 5)
        rows.append(("top-512, 16 rows", top_same, ms, scores.numel() * 4 / ms / 1e6))


def check_page_copy(tri, ref, rows: list, failures: list[str]) -> None:
    src = torch.randint(0, 256, (4096, 1 << 16), dtype=torch.uint8, device="cuda")
    host = src.cpu().pin_memory()
    dst, want = torch.zeros_like(src), torch.zeros_like(src)
    perm = torch.randperm(4096, device="cuda")
    for name, source in (("page copy", src), ("page copy from pinned host", host)):
        for checksum in (False, True):
            sums = tri.copy_pages(source, perm, dst, perm, checksum)
            want_sums = ref.copy_pages(src, perm, want, perm, checksum)
            ok = torch.equal(dst, want) and (not checksum or torch.equal(sums, want_sums))
            label = name + (" + checksum" if checksum else "")
            if not ok:
                failures.append(f"{label}: differs from the reference")
            ms = timed_ms(lambda s=source, c=checksum: tri.copy_pages(s, perm, dst, perm, c))
            rows.append((label, ok, ms, 2 * src.numel() / ms / 1e6))


# -- 2. the race on CUDA ------------------------------------------------------------------


def check_race(failures: list[str]) -> list[str]:
    """Gated and ungated trials at a few compute scales; returns report lines."""
    from dsv4_engine.features import IndexDtype
    from dsv4_engine.hicache.race import RaceConfig, run_trial

    lines = []
    ungated_stale = 0
    for compute_s in (0.0, 2e-5, 2e-4):
        for gated in (True, False):
            trials = [
                run_trial(
                    RaceConfig(
                        IndexDtype.BF16,
                        gated,
                        seed,
                        device="cuda",
                        bandwidth_bytes_per_s=None,
                        num_requests=16,
                        prefix_pages=64,
                        max_layer_compute_s=compute_s,
                    )
                )  # fmt: skip
                for seed in range(4)
            ]
            stale = sum(t.stale_index_k_reads for t in trials)
            kv_stale = sum(t.stale_kv_reads for t in trials)
            wrong = sum(t.mismatched for t in trials)
            lines.append(
                f"race {'gated  ' if gated else 'UNGATED'} compute <= {compute_s * 1e6:5.0f} us/layer: "
                f"{stale} stale index-K reads, {kv_stale} stale KV reads, "
                f"{wrong}/{sum(len(t.outcomes) for t in trials)} requests != reference"
            )
            if gated and (stale or kv_stale or wrong):
                failures.append(f"gated race (compute {compute_s}s): stale reads or wrong answers")
            if not gated:
                ungated_stale += stale
                if kv_stale:
                    failures.append("ungated race: KV reads were stale (only index-K skips)")
    if ungated_stale == 0:
        failures.append(
            "ungated race: the pool observed no stale index-K read at any compute scale "
            "(every copy landed before its reads: the race was not reproduced)"
        )
    return lines


# -- 3. copy / compute overlap ------------------------------------------------------------


def measure_overlap(failures: list[str]) -> str:
    """Seconds of a load alone, a forward alone, and both; the overlap they show."""
    from dsv4_engine.features import IndexDtype
    from dsv4_engine.hicache.host_pool import HostPool
    from dsv4_engine.hicache.transfer import TransferController
    from dsv4_engine.pools.device_pool import DevicePool
    from dsv4_engine.pools.layout import INDEXED_RATIO, ModelShape
    from dsv4_engine.presets import preset_config

    shape = ModelShape.from_hf_config(preset_config("v4-flash"), page_size=256)
    pages = 256
    pool = DevicePool(shape, 2 * pages, IndexDtype.FP8, device="cuda", ungated_index_k=False)
    host = HostPool(pool.layout, pages, pin_memory=True)
    controller = TransferController(pool, host)
    device_pages = pool.allocator.allocate(pages)
    for layer in range(shape.num_layers):
        locs = pool.entry_locs(layer, device_pages)
        pool.store_kv(layer, locs, torch.randn(len(locs), shape.kv_dim, device="cuda"))
    host_pages = host.allocate(pages)
    controller.backup(device_pages, host_pages)
    q = torch.randn(1, shape.index_n_heads, shape.index_head_dim, device="cuda")
    w = torch.rand(1, shape.index_n_heads, device="cuda")
    per_layer_cycles = 200_000  # ~0.1 ms of GPU time per layer, plus the reads

    def forward() -> None:
        for layer, ratio in enumerate(shape.compress_ratios):
            torch.cuda._sleep(per_layer_cycles)
            locs = pool.entry_locs(layer, device_pages)
            if ratio == INDEXED_RATIO:
                pool.index_scores(layer, locs, q, w)
            pool.read_kv(layer, locs)

    def timed(fn) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - start

    def load() -> None:
        controller.load(host_pages, device_pages).wait_all(60)

    def both() -> None:
        pending = controller.load(host_pages, device_pages)
        forward()
        pending.wait_all(60)

    for fn in (load, forward, both):  # warm-up: kernels compiled, caches allocated
        timed(fn)
    t_load = min(timed(load) for _ in range(3))
    t_fwd = min(timed(forward) for _ in range(3))
    t_both = min(timed(both) for _ in range(3))
    controller.close()
    hidden = (t_load + t_fwd - t_both) / min(t_load, t_fwd)
    if hidden <= 0:
        failures.append(
            f"copy/compute overlap: load {t_load * 1e3:.2f} ms + forward {t_fwd * 1e3:.2f} ms "
            f"took {t_both * 1e3:.2f} ms together: they did not overlap"
        )
    return (
        f"overlap (V4-Flash layers, {pages} pages, {pool.layout.page_bytes * pages / 1e6:.0f} MB): "
        f"load {t_load * 1e3:.2f} ms, forward {t_fwd * 1e3:.2f} ms, both {t_both * 1e3:.2f} ms "
        f"-> {hidden:.0%} of the shorter one hidden"
    )


def main() -> int:
    if not torch.cuda.is_available():
        print(
            "gpu_kernels_check: FAILED TO RUN: no CUDA device here (torch.cuda.is_available() "
            "is False); nothing was checked. Run it on a machine with an NVIDIA GPU.",
            file=sys.stderr,
        )
        return NO_CUDA_EXIT
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
    print(f"{'kernel':34} {'ok':5} {'ms':>8} {'GB/s':>8} {'% of d2d copy':>14}")
    for name, ok, ms, gbs in rows:
        print(f"{name:34} {str(ok):5} {ms:8.3f} {gbs:8.0f} {gbs / d2d * 100:13.0f}%")
    for line in check_race(failures):
        print(line)
    print(measure_overlap(failures))
    for failure in failures:
        print("FAIL", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
