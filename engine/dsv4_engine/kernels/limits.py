"""What a GPU target allows one kernel, and a compiled kernel's use of it: no Triton, no
kernels imported, so a test process can read results `kernels.targets` produced elsewhere
without binding Triton to a backend (the kernel tests run Triton's CPU interpreter)."""

from __future__ import annotations

from dataclasses import dataclass

# Compute capability → the most shared memory one block may use (bytes): "Maximum amount of
# shared memory per thread block" in the CUDA C++ Programming Guide's table of technical
# specifications per compute capability (227 KB for 9.0 and 10.0, 99 KB for 12.0).
TARGETS = {"sm90": 90, "sm100": 100, "sm120": 120}
SHARED_LIMIT = {90: 227 * 1024, 100: 227 * 1024, 120: 99 * 1024}


@dataclass(frozen=True)
class Compiled:
    case: str
    kernel: str  # the @triton.jit function's name
    target: str
    seconds: float
    registers: int
    spilled_bytes: int  # local memory and stack: a register spill, or an array in memory
    shared_bytes: int  # what a launch asks for (Triton's dynamic shared memory)
    shared_limit: int
    mma_instructions: int  # tensor-core instructions in its PTX (wgmma, tcgen05.mma, mma.sync)

    def problems(self) -> list[str]:
        """What a GPU of this target would make of it; empty when nothing."""
        found = []
        if self.spilled_bytes:
            found.append(f"{self.spilled_bytes} bytes of local memory (spilled registers)")
        if self.shared_bytes > self.shared_limit:
            found.append(f"{self.shared_bytes} B shared memory > the {self.shared_limit} B limit")
        return found
