"""Host↔device page transfers: asynchronous per-layer loads and synchronous backups.

A load copies layer 0's segments for every page, checks them against the checksums taken
at backup, stamps the verified pages with the load's generation (what the pool's
stale-read check compares), marks layer 0 done, then layer 1, ... on a worker thread, so
compute can start on layer 0 while later layers are still in flight.  The load is
registered with the pool's gate *before* `load()` returns, so no read of those pages can
precede it.

On CUDA, as SGLang's cache controller does it:

- a load fence: `load()` records an event on the caller's (compute) stream and the copy
  stream waits on it before writing, so compute already queued on the freed pages the load
  reuses (reads of their previous owner) runs first;
- copy (the paged-copy kernel reading pinned host memory), checksums, their comparison and
  the generation stamps all run on the copy stream, and layer L's event is recorded after
  them: a reader's stream that waits on it waits for verified data, with no host
  synchronisation per segment or layer, so compute reads layer L while layer L+1 copies;
- the checksum verdict reaches the host once per load, when the worker waits for the
  load's last event (off the compute path): a corrupt page fails the load from its layer
  on, and reads that already ran on it count as stale (its stamp never advanced).

On CPU the copy is paced as a transfer costs: a fixed latency per layer (a copy's launch
and setup, whatever its size) and then its bytes at a bandwidth, chunk by chunk: a layer's
copy takes longer the more bytes it moves (bf16 index-K more than fp8), and a reader that
skips the gate sees a layer not yet or partly copied, as it would on a GPU.  The verdict is
known at once there: a corrupt layer fails the load before its readers are released.

Fault injection on CPU does not leave the race to timing: on a loaded machine a starved
engine reaches its indexer after a fast copy has landed, and a raced canary that must FAIL
measured ~2% corrupt.  A load that draws the race (`DevicePool._load_races`) holds each
layer's index-K copy until the step reading it has done its index-K reads of that layer —
its first KV access of the layer, which every model makes after all of them, batch-wide
(`LayerLoad.wait_released`) — and its pages hold other pages' keys meanwhile
(`_leave_stale`: a page an offload freed is handed back to the same prefix, still holding
the keys it is about to load).  Every ungated index-K read of that step then reads stale
keys, as the seed's reader did; a gated read waits, as without the fault.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from dsv4_engine.hicache.host_pool import HostPool
from dsv4_engine.pools.device_pool import DevicePool
from dsv4_engine.pools.gate import LayerLoad, TransferFailed
from dsv4_engine.pools.layout import BufferKind, Segment

logger = logging.getLogger(__name__)
# Fault injection on CPU: how long a raced load holds a layer's index-K copy at most,
# waiting for the step's first KV access of that layer (`LayerLoad.wait_released`).
RACED_HOLD_S = 5.0


@dataclass(frozen=True)
class TransferFault:
    """Fault injection: flip one byte of one page of one segment right after it is copied."""

    layer: int
    kind: BufferKind
    page_index: int = 0  # position in the load's page list
    byte: int = 0


@dataclass
class _Job:
    load: LayerLoad
    generation: int
    host_rows: torch.Tensor  # on the pool's device (the copy kernel reads host memory)
    device_rows: torch.Tensor
    host_pages: list[int]
    device_pages: list[int]
    want: torch.Tensor | None  # [segments, pages] checksums taken at backup, on the device
    fence: Any  # CUDA event on the caller's stream; None on CPU
    fault: TransferFault | None
    mismatches: list[tuple[Segment, torch.Tensor]] = field(default_factory=list)
    pinned: bool = True  # its host pages, until the copy has ended


class TransferController:
    def __init__(
        self,
        pool: DevicePool,
        host: HostPool,
        *,
        bandwidth_bytes_per_s: float | None = None,
        layer_latency_s: float = 0.0,
        verify_checksums: bool = True,
        chunk_bytes: int = 16 * 1024,
    ) -> None:
        if bandwidth_bytes_per_s is not None and bandwidth_bytes_per_s <= 0:
            raise ValueError(f"bandwidth_bytes_per_s={bandwidth_bytes_per_s}: expected > 0")
        if layer_latency_s < 0:
            raise ValueError(f"layer_latency_s={layer_latency_s}: expected >= 0")
        self.pool = pool
        self.host = host
        self.bandwidth = bandwidth_bytes_per_s
        self.layer_latency_s = layer_latency_s
        self.verify_checksums = verify_checksums
        self.chunk_bytes = chunk_bytes
        self._cuda = pool.device.type == "cuda"
        self._stream = torch.cuda.Stream(pool.device) if self._cuda else None
        self._seg_index = {(s.layer, s.kind): i for i, s in enumerate(pool.layout.segments)}
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._stale_offsets = random.Random(0)  # fault injection: whose keys a raced page holds
        self._worker = threading.Thread(target=self._run, name="hicache-load", daemon=True)
        self._worker.start()

    # -- device → host ------------------------------------------------------------------

    def backup(self, device_pages: list[int], host_pages: list[int]) -> None:
        """Copy device pages to host pages now, storing each segment's checksum."""
        self._check_lengths(device_pages, host_pages)
        dev_rows = torch.tensor(device_pages, dtype=torch.int64, device=self.pool.device)
        host_rows = torch.tensor(host_pages, dtype=torch.int64)
        for seg in self.pool.layout.segments:
            src = self.pool.buffer(seg.layer, seg.kind)  # gated: a page may still be loading
            self.host.segment(seg.layer, seg.kind)[host_rows] = src[dev_rows].cpu()
            sums = self.pool.ops.page_checksums(src, dev_rows)
            self.host.checksums(seg.layer, seg.kind)[host_rows] = sums.cpu()

    # -- host → device ------------------------------------------------------------------

    def load(
        self, host_pages: list[int], device_pages: list[int], fault: TransferFault | None = None
    ) -> LayerLoad:
        """Start loading host pages into device pages; returns the per-layer progress."""
        self._check_lengths(device_pages, host_pages)
        device = self.pool.device
        host_index = torch.tensor(host_pages, dtype=torch.int64)
        host_rows = host_index.to(device)
        device_rows = torch.tensor(device_pages, dtype=torch.int64, device=device)
        want = None
        if self.verify_checksums:
            stored = [self.host.checksums(s.layer, s.kind) for s in self.pool.layout.segments]
            want = torch.stack([sums[host_index] for sums in stored]).to(device)
        # On the caller's stream, before the fence and before any read of these pages.
        generation = self.pool._expect_load(device_rows)
        events = fence = None
        if self._cuda:
            events = [torch.cuda.Event() for _ in range(self.pool.shape.num_layers)]
            fence = torch.cuda.Event()
            fence.record()  # the load fence: what the caller queued on the pages so far
        load = LayerLoad(self.pool.shape.num_layers, events, raced=self.pool._load_races())
        if load.raced and not self._cuda:
            self._leave_stale(device_rows)
        self.host.pin(host_pages)
        self.pool.gate.register(load)
        self._jobs.put(
            _Job(
                load,
                generation,
                host_rows,
                device_rows,
                list(host_pages),
                list(device_pages),
                want,
                fence,
                fault,
            )
        )
        return load

    def _leave_stale(self, device_rows: torch.Tensor) -> None:
        """Fault injection on CPU, as a raced load starts: its pages' index-K rows hold
        other pages' keys (stale keys of another sequence, as the incident's reader found),
        not what a page freed by an offload and handed back to the same prefix may still
        hold — the keys it is about to load, which would make the race invisible."""
        pages = self.pool.allocator.num_pages
        shift = 1 + self._stale_offsets.randrange(max(1, pages - 1))
        others = (device_rows + shift) % pages
        for seg in self.pool.layout.segments:
            if seg.kind is BufferKind.INDEX_K:
                buf = self.pool._transfer_buffer(seg.layer, seg.kind)
                buf[device_rows] = buf[others]

    def close(self) -> None:
        self._jobs.put(None)
        self._worker.join(timeout=30)

    def _check_lengths(self, device_pages: list[int], host_pages: list[int]) -> None:
        if len(device_pages) != len(host_pages):
            raise ValueError(
                f"{len(device_pages)} device pages vs {len(host_pages)} host pages: "
                "expected one host page per device page"
            )

    def _run(self) -> None:
        with torch.inference_mode():  # as the engine's loop: no autograd here either
            self._serve()

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                if self._stream is None:
                    self._load_layers(job)
                else:
                    with torch.cuda.stream(self._stream):
                        self._stream.wait_event(job.fence)
                        self._load_layers(job)
                    self._settle(job)
            except Exception as exc:  # a reader must fail fast, not time out
                logger.exception("hicache load failed")
                if self._stream is None:
                    self._unpin(job)
                self._fail(job, TransferFailed(f"load failed: {exc}"), None)
            finally:
                if self._stream is not None:
                    self._stream.synchronize()  # the host pages are read until the copy ends
                self._unpin(job)

    def _unpin(self, job: _Job) -> None:
        """Let the host tier evict or reuse the load's host pages again (once).  On CPU the
        copy has ended before the load reports done or failed, and the pages are unpinned
        before it does: whoever sees the load finished sees its pages evictable, so the
        prefix cache's eviction choices do not depend on how fast this thread runs."""
        if job.pinned:
            job.pinned = False
            self.host.unpin(job.host_pages)

    def _load_layers(self, job: _Job) -> None:
        due = time.monotonic()  # CPU: when what is copied so far would have landed
        for layer in range(self.pool.shape.num_layers):
            due = self._pace(due, self.layer_latency_s)
            for seg in self.pool.layout.layer_segments(layer):
                if seg.kind is BufferKind.INDEX_K and job.load.raced and not self._cuda:
                    job.load.wait_released(layer, RACED_HOLD_S)
                    due = max(due, time.monotonic())  # the hold is no link time
                due = self._copy_segment(job, seg, due)
            ok = self._verify_layer(job, layer)
            self.pool._mark_landed(layer, job.device_rows, job.generation, ok)
            if job.load.cuda_events is not None:
                job.load.cuda_events[layer].record(self._stream)
            elif ok is not None and not bool(ok.all()):
                self._unpin(job)
                self._fail(job, *self._corruption(job))
                return
            if layer == self.pool.shape.num_layers - 1 and not self._cuda:
                self._unpin(job)
            job.load.layer_done(layer)

    def _copy_segment(self, job: _Job, seg: Segment, due: float) -> float:
        src = self.host.segment(seg.layer, seg.kind)
        dst = self.pool._transfer_buffer(seg.layer, seg.kind)
        pages = len(job.host_pages)
        # Chunks only pace the CPU copy; on CUDA one launch moves the whole segment.
        step = pages if self._cuda else max(1, self.chunk_bytes // seg.page_bytes)
        for lo in range(0, pages, step):
            rows = slice(lo, lo + step)
            self.pool.ops.copy_pages(src, job.host_rows[rows], dst, job.device_rows[rows])
            self._inject(job, seg, dst, lo, step)
            nbytes = len(job.host_pages[rows]) * seg.page_bytes
            due = self._pace(due, nbytes / self.bandwidth if self.bandwidth else 0.0)
        return due

    def _pace(self, due: float, seconds: float) -> float:
        """CPU: wait until `seconds` past `due` (what the copy so far would take); returns
        that time.  On CUDA the copy takes what it takes."""
        if self._cuda or not seconds:
            return due
        due += seconds
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        return due

    def _inject(self, job: _Job, seg: Segment, dst: torch.Tensor, lo: int, step: int) -> None:
        fault = job.fault
        if fault is None or (fault.layer, fault.kind) != (seg.layer, seg.kind):
            return
        if lo <= fault.page_index < lo + step:
            dst[job.device_pages[fault.page_index], fault.byte] ^= 0xFF

    def _verify_layer(self, job: _Job, layer: int) -> torch.Tensor | None:
        """Per page of the load, whether every segment of `layer` arrived as it was stored
        (None without checksums).  Device tensors only: nothing waits for the copy here."""
        if job.want is None:
            return None
        ok: torch.Tensor | None = None
        for seg in self.pool.layout.layer_segments(layer):
            dst = self.pool._transfer_buffer(seg.layer, seg.kind)
            got = self.pool.ops.page_checksums(dst, job.device_rows)
            mismatch = got != job.want[self._seg_index[(seg.layer, seg.kind)]]
            job.mismatches.append((seg, mismatch))
            ok = ~mismatch if ok is None else ok & ~mismatch
        return ok

    def _corruption(self, job: _Job) -> tuple[TransferFailed, int | None]:
        """The first segment with a page whose checksum did not match (host sync: on CUDA
        only once the load's copy stream has run)."""
        for seg, mismatch in job.mismatches:
            bad = mismatch.nonzero().flatten().tolist()
            if bad:
                pages = [job.host_pages[i] for i in bad]
                return TransferFailed(
                    f"layer {seg.layer} {seg.kind.value}: host pages {pages} arrived with a "
                    "wrong checksum (corrupted in transit)"
                ), seg.layer
        raise AssertionError("no mismatching page")

    def _settle(self, job: _Job) -> None:
        """CUDA, once per load on this worker thread: wait for its last event, then fail the
        load from the first corrupt layer, if any."""
        job.load.cuda_events[-1].synchronize()  # type: ignore[index]
        if any(bool(mismatch.any()) for _, mismatch in job.mismatches):
            self._fail(job, *self._corruption(job))
        else:
            job.load.settle()

    def _fail(self, job: _Job, error: TransferFailed, from_layer: int | None) -> None:
        layer = job.load.layers_done() if from_layer is None else from_layer
        self.pool._forgive_load(job.device_rows, layer)
        job.load.fail(error, layer)
