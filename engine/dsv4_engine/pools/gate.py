"""The per-layer transfer gate: the one place a read of layer L waits for layer L's load.

A host→device load copies layer 0, then 1, ...; the producer marks each layer done (and on
CUDA records an event on the copy stream).  `LayerGate.wait_layer(L)` is the consumer side
(SGLang's `LayerDoneCounter.wait_until`): it returns once every load in flight has finished
layer L, or raises if that layer's copy failed its checksum or took longer than a bound.
The device pool calls it from its single buffer accessor, so no read path can skip it.
"""

from __future__ import annotations

import threading
import time
from typing import Any


class TransferTimeout(RuntimeError):
    """A layer's load did not finish within the gate's bound (a stuck copy, not a slow one)."""


class TransferFailed(RuntimeError):
    """A layer's load finished but its data is wrong (e.g. a page failed its checksum)."""


class LayerLoad:
    """Producer/consumer progress of one host→device load, one counter step per layer.

    The producer calls `layer_done(L)` in layer order; consumers `wait_until(L)`.  With CUDA,
    `cuda_events[L]` is recorded on the copy stream and the consumer's stream waits on it, so
    the CPU only waits for the event to be *recorded*, the GPU for the copy itself; the
    load's checksum verdict comes later (`settle` or `fail`), and until it has, the load is
    not finished: the gate keeps it, so a late failure still reaches readers.
    """

    def __init__(
        self, num_layers: int, cuda_events: list[Any] | None = None, raced: bool = False
    ) -> None:
        self.num_layers = num_layers
        self.cuda_events = cuda_events
        self.raced = raced  # fault injection: index-K reads do not wait for this load
        # Raced loads on CPU: per layer, set once a KV access of that layer came (every
        # index-K read of a layer precedes its KV accesses, batch-wide): until then the
        # producer holds the layer's index-K copy (`wait_released`).
        self._released = [threading.Event() for _ in range(num_layers)] if raced else []
        self._layers_done = 0
        self._error: TransferFailed | None = None
        self._failed_from = num_layers  # first layer the error covers
        self._settled = cuda_events is None  # on CPU each layer's verdict precedes its done
        self._cond = threading.Condition()

    def layers_done(self) -> int:
        return self._layers_done

    def failed(self) -> bool:
        return self._error is not None

    def done(self) -> bool:
        return self._layers_done >= self.num_layers or self._error is not None

    def finished_ok(self) -> bool:
        """Every layer landed and verified (on CUDA: the producer settled it) and none failed."""
        return self._error is None and self._layers_done >= self.num_layers and self._settled

    def settle(self) -> None:
        """CUDA: the producer saw the last copy event complete and every checksum match."""
        self._settled = True

    def needs_wait(self, layer: int) -> bool:
        """False once a read of `layer` can proceed without waiting on this load."""
        if self._layers_done <= layer or (self._error is not None and layer >= self._failed_from):
            return True
        return self.cuda_events is not None and not self.cuda_events[layer].query()

    def release(self, layer: int) -> None:
        """Consumer, fault injection: a KV access of `layer` came, after every index-K read
        of it in the step; the held index-K copy of `layer` may land."""
        self._released[layer].set()

    def wait_released(self, layer: int, hold_s: float) -> None:
        """Producer, fault injection on CPU: hold `layer`'s index-K copy until the step that
        reads it has done its index-K reads of that layer (its first KV access; at most
        `hold_s`).  Every ungated index-K read of the loading step then outruns the copy,
        as the seed's reader did under load, whatever this machine's load: a raced load
        corrupts by construction, not by how the CPU happened to schedule the copy."""
        self._released[layer].wait(hold_s)

    def layer_done(self, layer: int) -> None:
        with self._cond:
            if layer != self._layers_done:
                raise RuntimeError(f"layer {layer} done out of order (next is {self._layers_done})")
            self._layers_done = layer + 1
            self._cond.notify_all()

    def fail(self, error: TransferFailed, from_layer: int | None = None) -> None:
        """Reads of layers from `from_layer` (default: the first not yet done) raise `error`.

        On CUDA a checksum verdict is known only once the copy stream ran, after the layers
        were handed to readers; it then names the first layer it covers.
        """
        with self._cond:
            self._error = error
            self._failed_from = self._layers_done if from_layer is None else from_layer
            self._cond.notify_all()

    def wait_until(self, layer: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._layers_done <= layer and self._error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TransferTimeout(
                        f"layer {layer} not loaded after {timeout_s}s "
                        f"({self._layers_done}/{self.num_layers} layers done)"
                    )
                self._cond.wait(left)
            if self._error is not None and layer >= self._failed_from:
                raise self._error
        if self.cuda_events is not None:
            import torch

            torch.cuda.current_stream().wait_event(self.cuda_events[layer])

    def wait_all(self, timeout_s: float) -> None:
        for event in self._released:  # whoever waits for the whole load reads none of it
            event.set()
        self.wait_until(self.num_layers - 1, timeout_s)


class LayerGate:
    """The choke point: `wait_layer(L)` before any read of layer L's device data.

    Finished loads are dropped, so with nothing in flight a read costs one list check.  A
    failed load stays and fails every read of its layers until `discard(load)` (after the
    engine has dropped its pages): corrupt pages are never read silently.
    """

    def __init__(self, num_layers: int, timeout_s: float = 60.0) -> None:
        self.num_layers = num_layers
        self.timeout_s = timeout_s
        self._loads: list[LayerLoad] = []
        self._lock = threading.Lock()
        # Counters for metrics (read without the lock: approximate under concurrency).
        self.waits = 0  # reads that passed the gate
        self.blocked = 0  # of those, reads that found their layer still loading

    def register(self, load: LayerLoad) -> None:
        """Called by the transfer controller *before* the load's pages are handed out."""
        with self._lock:
            self._loads = [ld for ld in self._loads if not ld.finished_ok()]
            self._loads.append(load)

    def discard(self, load: LayerLoad) -> None:
        with self._lock:
            self._loads = [ld for ld in self._loads if ld is not load]

    def tracking(self) -> bool:
        """Whether any load is registered: in flight, failed, or finished but not yet
        dropped.  With none, every page holds what it is owed."""
        return bool(self._loads)

    def release_raced(self, layer: int) -> None:
        """Fault injection: a KV access of `layer` is about to wait for it; raced loads
        holding that layer's index-K copy may now copy it (`LayerLoad.wait_released`)."""
        with self._lock:
            raced = [ld for ld in self._loads if ld.raced and ld.needs_wait(layer)]
        for load in raced:
            load.release(layer)

    def wait_layer(self, layer: int, skip_raced: bool = False) -> None:
        """`skip_raced`: fault injection only — do not wait for loads marked raced."""
        if not 0 <= layer < self.num_layers:
            raise IndexError(f"layer {layer}: expected 0..{self.num_layers - 1}")
        self.waits += 1
        if not self._loads:
            return
        with self._lock:
            self._loads = [ld for ld in self._loads if not ld.finished_ok()]
            pending = [
                ld for ld in self._loads if ld.needs_wait(layer) and not (skip_raced and ld.raced)
            ]
            self.blocked += bool(pending)
        for load in pending:
            load.wait_until(layer, self.timeout_s)
