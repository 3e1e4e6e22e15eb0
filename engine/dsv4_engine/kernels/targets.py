"""Every Triton kernel compiled for the GPUs production runs on, without a GPU.

Triton compiles ahead of time for any CUDA target with its own compiler and the ptxas its
wheel bundles (`triton/backends/nvidia/bin`), so a CPU machine can check what a GPU would
refuse or run slowly: a kernel that spills registers to local memory, or asks for more
shared memory per block than the target has.  The cases are the configurations the
launchers (`index_k_triton`, `paged_copy_triton`, `topk_triton`) use for the DeepSeek-V4
presets' indexer shapes (`presets/*.json`); `tests/unit/engine/test_kernel_targets.py`
compiles each for each target, and `bench/gpu_kernels_check.py` runs them on a device.

Compiled kernels land in Triton's cache (`TRITON_CACHE_DIR`, by default under the home
directory, outside the checkout), so a second run only reads them back.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import triton

from dsv4_engine.features import IndexDtype
from dsv4_engine.index_k import index_key_format
from dsv4_engine.kernels import index_k_triton, paged_copy_triton, topk_triton
from dsv4_engine.kernels.limits import SHARED_LIMIT, TARGETS, Compiled
from dsv4_engine.presets import PRESETS, preset_config

CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
_RESOURCES = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")
# A tensor-core multiply in PTX: Hopper's wgmma, Blackwell's tcgen05.mma, or the mma.sync
# every target since Ampere has (sm120 among them, which has neither of the others).
_MMA = re.compile(r"\b(?:wgmma\.mma_async|tcgen05\.mma|mma\.sync)\b")


@dataclass(frozen=True)
class Case:
    """One kernel in one configuration a launcher uses."""

    name: str
    kernel: Any  # a triton.JITFunction
    signature: dict[str, str]  # runtime argument → Triton type ("*u8", "i32", ...)
    constexprs: dict[str, Any]
    num_warps: int = 4  # Triton's default, where the launcher passes none


def _index_cases(head_dim: int, heads: int) -> list[Case]:
    """Store, read and score, for the two index-K dtypes with kernels (fp4 runs torch)."""
    buffers = {"buf_u8": "*u8", "buf_f32": "*fp32", "page_ptr": "*i64", "slot_ptr": "*i64"}
    sizes = {"n": "i32", "page_bytes": "i32", "entries": "i32"}
    cases = []
    for dtype in (IndexDtype.FP8, IndexDtype.BF16):
        fmt = index_key_format(dtype, head_dim)
        consts = {
            **index_k_triton.format_constants(fmt),
            "BLOCK_N": index_k_triton.BLOCK_N,
        }
        tag = f"d{head_dim}-{dtype.value}"
        cases += [
            Case(
                f"index-k store {tag}",
                index_k_triton.store_kernel,
                {
                    "keys_ptr": "*fp32",
                    "buf_u8": "*u8",
                    "buf_f32": "*fp32",
                    "buf_i16": "*i16",
                    "page_ptr": "*i64",
                    "slot_ptr": "*i64",
                    **sizes,
                },
                consts,
                index_k_triton.STORE_READ_WARPS,
            ),
            Case(
                f"index-k read {tag}",
                index_k_triton.read_kernel,
                {**buffers, "buf_bf16": "*bf16", "out_ptr": "*fp32", **sizes},
                consts,
                index_k_triton.STORE_READ_WARPS,
            ),
            Case(
                f"indexer score {tag} h{heads}",
                index_k_triton.score_kernel,
                {
                    **buffers,
                    "buf_bf16": "*bf16",
                    "q_hi_ptr": "*bf16",
                    "q_lo_ptr": "*bf16",
                    "w_ptr": "*fp32",
                    "out_ptr": "*fp32",
                    "tokens": "i32",
                    "heads": "i32",
                    **sizes,
                },
                index_k_triton.score_constants(fmt, heads, tokens=1),
                index_k_triton.SCORE_WARPS,
            ),
        ]
    return cases


def _topk_cases(k: int) -> list[Case]:
    """Both passes of the top-k at the chunk and rows-per-program `topk` picks for ``k``
    on a long row (one longer than a chunk)."""
    chunk, block_r = topk_triton.chunking(rows=1 << 16, n=1 << 20, k=k)
    signature = {"in_ptr": "*fp32", "out_ptr": "*i64", "rows": "i32", "n": "i32",
                 "in_stride": "i32", "out_stride": "i32", "k": "i32"}  # fmt: skip
    return [
        Case(
            f"top-k k{k} {'scores' if first else 'keys'}",
            topk_triton.topk_kernel,
            {**signature, "in_ptr": "*fp32" if first else "*i64"},
            {"CHUNK": chunk, "BLOCK_R": block_r, "FROM_SCORES": first},
        )
        for first in (True, False)
    ]


def _copy_cases() -> list[Case]:
    signature = {"src_ptr": "*u8", "src_rows_ptr": "*i64", "src_stride": "i64",
                 "dst_ptr": "*u8", "dst_rows_ptr": "*i64", "dst_stride": "i64", "n": "i32",
                 "row_bytes": "i32", "sum_ptr": "*i64"}  # fmt: skip
    fixed = {
        "PERIOD": paged_copy_triton.CHECKSUM_PERIOD,
        "ROWS": paged_copy_triton.COPY_ROWS,
        "BLOCK": paged_copy_triton.COPY_BLOCK,
    }
    modes = {"copy": (True, False), "copy+checksum": (True, True), "checksum": (False, True)}
    return [
        Case(
            f"paged {mode}",
            paged_copy_triton.copy_kernel,
            signature,
            {"WRITE": write, "CHECKSUM": checksum, **fixed},
        )  # fmt: skip
        for mode, (write, checksum) in modes.items()
    ]


def cases() -> list[Case]:
    """Every kernel configuration the presets' shapes launch, each once."""
    found: dict[str, Case] = {}
    for preset in PRESETS:
        config = preset_config(preset)
        for case in [
            *_index_cases(config["index_head_dim"], config["index_n_heads"]),
            *_topk_cases(config["index_topk"]),
        ]:
            found.setdefault(case.name, case)
    for case in _copy_cases():
        found.setdefault(case.name, case)
    return list(found.values())


def compile_for(case: Case, target: str) -> Compiled:
    """``case`` compiled for ``target`` (a key of `TARGETS`), and what its cubin uses."""
    # Imported here: the compiler binds Triton's device libraries to the CUDA backend, which
    # a CPU interpreter run of the kernels in the same process must not find bound.
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    arch = TARGETS[target]
    signature = {**case.signature, **dict.fromkeys(case.constexprs, "constexpr")}
    source = ASTSource(fn=case.kernel, signature=signature, constexprs=case.constexprs)
    started = time.monotonic()
    options = {"num_warps": case.num_warps}
    kernel = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    seconds = time.monotonic() - started
    registers, stack, _, local = _resources(kernel.asm["cubin"])
    return Compiled(
        case.name,
        case.kernel.fn.__name__,
        target,
        seconds,
        registers,
        stack + local,
        int(kernel.metadata.shared),
        SHARED_LIMIT[arch],
        len(_MMA.findall(kernel.asm["ptx"])),
    )


def _resources(cubin: bytes) -> tuple[int, int, int, int]:
    """(registers, stack, static shared, local) bytes of the cubin's one function, as
    `cuobjdump -res-usage` reports them."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        out = subprocess.run(
            [str(CUOBJDUMP), "-res-usage", file.name], capture_output=True, text=True, check=True
        ).stdout
    found = _RESOURCES.search(out)
    if found is None:
        raise RuntimeError(f"cuobjdump -res-usage printed no resource line:\n{out}")
    registers, stack, shared, local = (int(g) for g in found.groups())
    return registers, stack, shared, local


def main(argv: list[str] | None = None) -> int:
    """`python -m dsv4_engine.kernels.targets [--json]`: compile every case for every
    target in this process (a compile for a CUDA target leaves Triton state behind that a
    CPU interpreter run in the same process must not meet), print a table or one JSON
    object per compile, and exit 1 if any has a problem."""
    import argparse
    import json
    from dataclasses import asdict

    parser = argparse.ArgumentParser(prog="python -m dsv4_engine.kernels.targets")
    parser.add_argument("--json", action="store_true", help="one JSON object per compile")
    args = parser.parse_args(argv)
    results = [compile_for(case, target) for case in cases() for target in TARGETS]
    for r in results:
        if args.json:
            print(json.dumps(asdict(r)))
        else:
            verdict = "; ".join(r.problems()) or "ok"
            print(
                f"{r.case:<32} {r.target:<6} {r.seconds:6.2f} s {r.registers:>4} regs "
                f"{r.shared_bytes:>7} B shared {r.spilled_bytes:>6} B local "
                f"{r.mma_instructions:>4} mma  {verdict}"
            )
    return 1 if any(r.problems() for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
