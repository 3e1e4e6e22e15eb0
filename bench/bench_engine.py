"""Engine pools / HiCache / kernels benchmark (`make bench-engine`), printed as tables.

1. Gate overhead with every layer already loaded: the read path of one decode step through
   the gate vs the same reads straight from the buffers (goal: within noise, <= 2%).
2. HiCache load of a long shared prefix (V4-Flash pages) vs recomputing it.
3. The race: how often an ungated index-K read corrupts top-k, fp8 vs bf16.
4. Kernel times, Triton vs torch reference.  Without CUDA the Triton kernels run in the
   CPU interpreter: those numbers check that they run, they are NOT speed numbers.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Callable

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any Triton kernel is decorated

from dsv4_engine.features import IndexDtype  # noqa: E402
from dsv4_engine.hicache.host_pool import HostPool  # noqa: E402
from dsv4_engine.hicache.race import RaceConfig, run_trial  # noqa: E402
from dsv4_engine.hicache.transfer import TransferController  # noqa: E402
from dsv4_engine.kernels import get_ops  # noqa: E402
from dsv4_engine.pools.device_pool import DevicePool  # noqa: E402
from dsv4_engine.pools.gate import LayerLoad  # noqa: E402
from dsv4_engine.pools.layout import INDEXED_RATIO, BufferKind, ModelShape  # noqa: E402
from dsv4_engine.presets import preset_config  # noqa: E402

FLASH = ModelShape.from_hf_config(preset_config("v4-flash"), page_size=128)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print(f"\n## {title}")
    for r in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


# -- 1. gate overhead -------------------------------------------------------------------


def decode_reads(pool: DevicePool, pages: list[int], q: torch.Tensor, w: torch.Tensor,
                 gated: bool) -> None:  # fmt: skip
    """One decode step's reads of every layer: index-K scores, top-512, KV gather, state."""
    access = pool.buffer if gated else pool._lookup
    for layer, ratio in enumerate(pool.shape.compress_ratios):
        locs = pool.entry_locs(layer, pages)
        if ratio == INDEXED_RATIO:
            buf = access(layer, BufferKind.INDEX_K)
            scores = pool.ops.index_scores(
                buf, locs, pool.layout.index_format, pool.entries_per_page(layer), q, w
            )
            locs = locs[pool.ops.topk(scores, min(512, len(locs)))[0]]
        kv = access(layer, BufferKind.KV).view(torch.bfloat16).view(-1, pool.shape.kv_dim)
        kv[locs].float().sum(0)
        if ratio:
            access(layer, BufferKind.COMPRESS_STATE)[0].sum()


def bench_gate() -> None:
    pages_n = 16  # 2K tokens of context
    pool = DevicePool(FLASH, pages_n, IndexDtype.FP8, max_requests=1, device=DEVICE,
                      ungated_index_k=False)  # fmt: skip
    pages = pool.allocator.allocate(pages_n)
    for _ in range(4):  # finished loads: the gate drops them, then reads take the fast path
        load = LayerLoad(FLASH.num_layers)
        pool.gate.register(load)
        for layer in range(FLASH.num_layers):
            load.layer_done(layer)
    q = torch.randn(1, FLASH.index_n_heads, FLASH.index_head_dim, device=DEVICE)
    w = torch.rand(1, FLASH.index_n_heads, device=DEVICE)
    batches: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(20):  # alternating batches; the fastest batch is the least disturbed
        for gated in (True, False):
            access = pool.buffer if gated else pool._lookup
            start = time.perf_counter()
            for _ in range(2000):
                access(4, BufferKind.INDEX_K)
            batches[gated].append((time.perf_counter() - start) / 2000 * 1e6)
    per_call = {gated: min(times) for gated, times in batches.items()}
    ratios, step_ms = [], []
    for _ in range(60):  # paired runs: drift on a shared machine hits both halves of a pair
        gated_ms = median_ms(lambda: decode_reads(pool, pages, q, w, True), 1)
        ungated_ms = median_ms(lambda: decode_reads(pool, pages, q, w, False), 1)
        ratios.append(gated_ms / ungated_ms - 1)
        step_ms.append(ungated_ms)
    quartiles = statistics.quantiles(ratios, n=4)
    calls = sum(1 + (r == INDEXED_RATIO) + (r > 0) for r in FLASH.compress_ratios)
    added_ms = (per_call[True] - per_call[False]) * calls / 1e3
    table(
        f"Gate overhead, every layer loaded (V4-Flash, 43 layers, 2K-token context, {DEVICE})",
        ["measure", "value"],
        [
            ["accessor call, gated (wait_layer)", f"{per_call[True]:.2f} us"],
            ["accessor call, ungated", f"{per_call[False]:.2f} us"],
            [f"gate cost per decode step ({calls} accessor calls)", f"{added_ms * 1e3:.1f} us"],
            ["decode-step reads, ungated (median)", f"{statistics.median(step_ms):.2f} ms"],
            ["=> gate overhead from the call cost",
             f"{added_ms / statistics.median(step_ms) * 100:+.2f}%"],
            ["gated vs ungated, 60 paired steps: median [IQR]",
             f"{quartiles[1] * 100:+.2f}% [{quartiles[0] * 100:+.2f}%, {quartiles[2] * 100:+.2f}%]"],
        ],
    )  # fmt: skip


# -- 2. HiCache load vs recompute -------------------------------------------------------


def time_load(dtype: IndexDtype, prefix_pages: int, verify: bool) -> tuple[int, float]:
    """(bytes, best seconds) of loading a prefix's pages host -> device, unpaced."""
    pool = DevicePool(FLASH, prefix_pages, dtype, max_requests=1, device=DEVICE,
                      ungated_index_k=False)  # fmt: skip
    host = HostPool(pool.layout, prefix_pages, pin_memory=DEVICE == "cuda")
    controller = TransferController(pool, host, verify_checksums=verify, chunk_bytes=1 << 30)
    pages = pool.allocator.allocate(prefix_pages)
    host_pages = host.allocate(prefix_pages)
    controller.backup(pages, host_pages)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        controller.load(host_pages, pages).wait_all(300)
        times.append(time.perf_counter() - start)
    controller.close()
    return prefix_pages * pool.layout.page_bytes, min(times)


def bench_prefix_load() -> None:
    prefix_pages = 32  # 4K tokens
    rows = []
    for dtype in (IndexDtype.FP8, IndexDtype.BF16):
        for verify in (False, True):
            nbytes, load_s = time_load(dtype, prefix_pages, verify)
            rows.append([f"HiCache load, {dtype.value} index-K" + (", checksums" if verify else ""),
                         f"{nbytes / 2**20:.1f} MiB", f"{load_s * 1e3:.1f} ms",
                         f"{nbytes / load_s / 1e9:.2f} GB/s"])  # fmt: skip
    # Recompute, a lower bound: only the projections that produce each layer's KV and index
    # keys from hidden states (no attention, no MoE), timed on 512 tokens and scaled.
    tokens, sample = prefix_pages * FLASH.page_size, 512
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32  # CPU bf16 matmul is a slow path
    x = torch.randn(sample, 4096, dtype=dtype, device=DEVICE)
    w_kv = torch.randn(4096, FLASH.kv_dim, dtype=dtype, device=DEVICE)
    w_ik = torch.randn(4096, FLASH.index_head_dim, dtype=dtype, device=DEVICE)
    kv_ms = median_ms(lambda: x @ w_kv, 5)
    ik_ms = median_ms(lambda: x @ w_ik, 5)
    per_layer = [kv_ms + (ik_ms if r == INDEXED_RATIO else 0) for r in FLASH.compress_ratios]
    recompute_ms = sum(per_layer) * tokens / sample
    rows.append(["recompute, lower bound: KV + index-K projections only",
                 f"{tokens} tokens", f"{recompute_ms:.1f} ms", ""])  # fmt: skip
    table(f"Shared prefix of {tokens} tokens, V4-Flash pages, {DEVICE} (load unpaced)",
          ["path", "size", "time", "throughput"], rows)  # fmt: skip


# -- 3. the race ------------------------------------------------------------------------


def bench_race(seeds: int = 10) -> None:
    logging.getLogger("dsv4_engine.pools.device_pool").setLevel(logging.ERROR)
    cfg = RaceConfig(IndexDtype.FP8, gated=False, seed=0)
    rows = []
    for gated in (True, False):
        for dtype in (IndexDtype.FP8, IndexDtype.BF16):
            trials = [run_trial(RaceConfig(dtype, gated, seed)) for seed in range(seeds)]
            n = sum(len(t.outcomes) for t in trials)
            load_ms = trials[0].transfer_bytes / (cfg.bandwidth_bytes_per_s or 1) * 1e3
            rows.append([
                "gated" if gated else "UNGATED index-K", dtype.value, str(n),
                f"{sum(t.stale for t in trials) / n:.1%}",
                f"{sum(t.topk_changed for t in trials) / n:.1%}",
                f"{sum(t.mismatched for t in trials) / n:.1%}",
                str(sum(t.stale_index_k_reads for t in trials)), f"{load_ms:.0f} ms",
            ])  # fmt: skip
    table(
        f"Race: {cfg.num_requests} concurrent requests x {seeds} seeds, "
        f"{cfg.prefix_pages} pages each, {cfg.bandwidth_bytes_per_s / 1e6:.0f} MB/s simulated, "
        f"compute 0-{cfg.max_layer_compute_s * 1e3:.0f} ms/layer",
        ["read path", "index-K", "requests", "stale index-K", "top-k changed", "!= reference",
         "stale reads seen by the pool", "batch load"],
        rows,
    )  # fmt: skip


# -- 4. kernels -------------------------------------------------------------------------


def index_k_rows(
    dtype: IndexDtype, pages: int, ref_repeat: int, tri_repeat: int
) -> list[list[str]]:
    ref, tri = get_ops("torch"), get_ops("triton")
    pool = DevicePool(FLASH, pages, dtype, device=DEVICE, ungated_index_k=False)
    fmt, entries = pool.layout.index_format, pool.entries_per_page(2)
    buf = pool.buffer(2, BufferKind.INDEX_K)
    locs = torch.arange(pages * entries, device=DEVICE)
    keys = torch.randn(len(locs), fmt.head_dim, device=DEVICE)
    q = torch.randn(1, FLASH.index_n_heads, fmt.head_dim, device=DEVICE)
    w = torch.rand(1, FLASH.index_n_heads, device=DEVICE)
    scores = torch.randn(1, len(locs), device=DEVICE)
    cases = {
        "store": lambda ops: ops.store_index_k(buf, locs, keys, fmt, entries),
        "read": lambda ops: ops.read_index_k(buf, locs, fmt, entries),
        "score": lambda ops: ops.index_scores(buf, locs, fmt, entries, q, w),
        "top-512": lambda ops: ops.topk(scores, min(512, len(locs))),
    }
    return [
        [f"index-K {name} ({dtype.value})", f"{len(locs)} keys",
         f"{median_ms(lambda f=fn: f(ref), ref_repeat):.2f}",
         f"{median_ms(lambda f=fn: f(tri), tri_repeat):.2f}"]
        for name, fn in cases.items()
    ]  # fmt: skip


def bench_kernels() -> None:
    # The interpreter runs a kernel element by element in numpy: tiny shapes only.
    native = DEVICE == "cuda"
    pages, row_bytes = (1024, 1 << 16) if native else (2, 4096)
    ref_repeat, tri_repeat = (20, 20) if native else (5, 1)
    ref, tri = get_ops("torch"), get_ops("triton")
    rows = [
        r
        for d in (IndexDtype.FP8, IndexDtype.BF16)
        for r in index_k_rows(d, pages, ref_repeat, tri_repeat)
    ]
    src = torch.randint(0, 256, (pages, row_bytes), dtype=torch.uint8, device=DEVICE)
    dst = torch.empty_like(src)
    idx = torch.randperm(pages, device=DEVICE)
    for name, checksum in (("page copy", False), ("page copy + checksum", True)):
        rows.append([name, f"{pages} x {row_bytes // 1024} KiB",
                     f"{median_ms(lambda c=checksum: ref.copy_pages(src, idx, dst, idx, c), ref_repeat):.2f}",
                     f"{median_ms(lambda c=checksum: tri.copy_pages(src, idx, dst, idx, c), tri_repeat):.2f}"])  # fmt: skip
    mode = "native" if native else "CPU INTERPRETER, tiny shapes: correctness only, NOT speed"
    table(f"Kernels (ms, median), triton = {mode}",
          ["kernel", "shape", "torch reference", "triton"], rows)  # fmt: skip


def main() -> None:
    torch.set_num_threads(1 if DEVICE == "cpu" else torch.get_num_threads())
    torch.manual_seed(0)
    print(f"bench-engine on {DEVICE}; torch {torch.__version__}")
    bench_gate()
    bench_prefix_load()
    bench_race()
    bench_kernels()


if __name__ == "__main__":
    main()
