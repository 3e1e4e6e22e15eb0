"""Host↔device page transfers: asynchronous per-layer loads and synchronous backups.

A load copies layer 0's segments for every page, marks layer 0 done, then layer 1, ...
on a worker thread (and on CUDA, on a side stream with one event per layer), so compute
can start on layer 0 while later layers are still in flight.  The load is registered with
the pool's gate *before* `load()` returns, so no read of those pages can precede it.

On CPU a bandwidth in bytes/s paces the copy chunk by chunk: a layer's copy then takes
time proportional to its bytes (bf16 index-K twice as long as fp8), and a reader that
skips the gate sees a partly copied layer, as it would on a GPU.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass

import torch

from dsv4_engine.hicache.host_pool import HostPool
from dsv4_engine.pools.device_pool import DevicePool
from dsv4_engine.pools.gate import LayerLoad, TransferFailed
from dsv4_engine.pools.layout import BufferKind, Segment

logger = logging.getLogger(__name__)


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
    host_rows: torch.Tensor
    device_rows: torch.Tensor
    host_pages: list[int]
    fault: TransferFault | None


class TransferController:
    def __init__(
        self,
        pool: DevicePool,
        host: HostPool,
        *,
        bandwidth_bytes_per_s: float | None = None,
        verify_checksums: bool = True,
        chunk_bytes: int = 16 * 1024,
    ) -> None:
        if bandwidth_bytes_per_s is not None and bandwidth_bytes_per_s <= 0:
            raise ValueError(f"bandwidth_bytes_per_s={bandwidth_bytes_per_s}: expected > 0")
        self.pool = pool
        self.host = host
        self.bandwidth = bandwidth_bytes_per_s
        self.verify_checksums = verify_checksums
        self.chunk_bytes = chunk_bytes
        self._cuda = pool.device.type == "cuda"
        self._stream = torch.cuda.Stream(pool.device) if self._cuda else None
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
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
        events = None
        if self._cuda:
            events = [torch.cuda.Event() for _ in range(self.pool.shape.num_layers)]
        load = LayerLoad(self.pool.shape.num_layers, events)
        self.host.pin(host_pages)
        self.pool.gate.register(load)
        self._jobs.put(
            _Job(
                load,
                torch.tensor(host_pages, dtype=torch.int64),
                torch.tensor(device_pages, dtype=torch.int64, device=self.pool.device),
                list(host_pages),
                fault,
            )
        )
        return load

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
        while (job := self._jobs.get()) is not None:
            try:
                self._load_layers(job)
            except Exception as exc:  # a reader must fail fast, not time out
                logger.exception("hicache load failed")
                job.load.fail(TransferFailed(f"load failed: {exc}"))
            finally:
                self.host.unpin(job.host_pages)

    def _load_layers(self, job: _Job) -> None:
        start = time.monotonic()
        sent = 0
        for layer in range(self.pool.shape.num_layers):
            for seg in self.pool.layout.layer_segments(layer):
                sent = self._copy_segment(job, seg, start, sent)
                error = self._verify(job, seg)
                if error is not None:
                    job.load.fail(error)
                    return
            if job.load.cuda_events is not None:
                job.load.cuda_events[layer].record(self._stream)
            job.load.layer_done(layer)

    def _copy_segment(self, job: _Job, seg: Segment, start: float, sent: int) -> int:
        src = self.host.segment(seg.layer, seg.kind)
        dst = self.pool._transfer_buffer(seg.layer, seg.kind)
        step = max(1, self.chunk_bytes // seg.page_bytes)
        for lo in range(0, len(job.host_pages), step):
            host_rows = job.host_rows[lo : lo + step]
            dev_rows = job.device_rows[lo : lo + step]
            if self._stream is not None:
                with torch.cuda.stream(self._stream):
                    staged = src[host_rows].pin_memory().to(dst.device, non_blocking=True)
                    dst[dev_rows] = staged
            else:
                self.pool.ops.copy_pages(src, host_rows, dst, dev_rows)
            self._inject(job.fault, seg, dst, dev_rows, lo)
            sent += len(host_rows) * seg.page_bytes
            self._pace(start, sent)
        return sent

    def _pace(self, start: float, sent: int) -> None:
        if self.bandwidth is None or self._cuda:
            return
        wait = start + sent / self.bandwidth - time.monotonic()
        if wait > 0:
            time.sleep(wait)

    def _inject(
        self,
        fault: TransferFault | None,
        seg: Segment,
        dst: torch.Tensor,
        rows: torch.Tensor,
        lo: int,
    ) -> None:
        if fault is None or (fault.layer, fault.kind) != (seg.layer, seg.kind):
            return
        if lo <= fault.page_index < lo + len(rows):
            row = int(rows[fault.page_index - lo])
            dst[row, fault.byte] ^= 0xFF

    def _verify(self, job: _Job, seg: Segment) -> TransferFailed | None:
        if not self.verify_checksums:
            return None
        dst = self.pool._transfer_buffer(seg.layer, seg.kind)
        if self._stream is not None:
            self._stream.synchronize()
        got = self.pool.ops.page_checksums(dst, job.device_rows).cpu()
        want = self.host.checksums(seg.layer, seg.kind)[job.host_rows]
        bad = (got != want).nonzero().flatten().tolist()
        if not bad:
            return None
        pages = [job.host_pages[i] for i in bad]
        return TransferFailed(
            f"layer {seg.layer} {seg.kind.value}: host pages {pages} arrived with a wrong "
            "checksum (corrupted in transit)"
        )
