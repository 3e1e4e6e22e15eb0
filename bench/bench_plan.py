"""How long `dsv4ctl plan` takes: it must stay interactive (well under a second).

Prints the in-process time of one full plan (pools, HiCache host bytes, legacy compare)
and the time of the whole command as a user runs it (interpreter start and imports
included): wall time, and CPU time, which a shared machine does not inflate.
"""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys
import time

from dsv4_engine.configurator import (
    EngineSettings,
    GiB,
    compare_legacy,
    gpu_budget,
    host_bytes_for_plan,
    model_spec_from_hf_config,
    plan_pools,
)
from dsv4_engine.engine_config import Backend
from dsv4_engine.features import IndexDtype
from dsv4_engine.presets import preset_config

# V4-Pro's weights do not fit four 180 GiB GPUs.
TP = {"v4-flash": 4, "v4-pro": 8}


def one_plan(preset: str) -> None:
    model = model_spec_from_hf_config(preset_config(preset))
    # bf16 (the legacy compare's dtype) is stored by the reference engine only.
    settings = EngineSettings(
        index_dtype=IndexDtype.BF16, engine=Backend.REFERENCE, tp_size=TP[preset]
    )
    budget = gpu_budget(model, settings, 180 * GiB)
    plan = plan_pools(model, settings, budget.kv_budget_bytes)
    host_bytes_for_plan(model, settings, plan, 2.0)
    compare_legacy(model, settings, budget.kv_budget_bytes)


def time_in_process(preset: str, runs: int = 200) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        one_plan(preset)
        times.append(time.perf_counter() - start)
    return times


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_command(preset: str, runs: int = 5) -> tuple[list[float], list[float]]:
    """(wall times, CPU times) of the whole `dsv4ctl plan` command."""
    argv = [
        sys.executable, "-m", "dsv4_operator.cli.main", "plan", "--preset", preset,
        "--gpu-memory", "180GiB", "--tp", str(TP[preset]), "--index-dtype", "bf16",
        "--engine", "reference", "--hicache-ratio", "2", "--legacy-compare",
    ]  # fmt: skip
    wall, cpu = [], []
    for _ in range(runs):
        start, cpu_start = time.perf_counter(), _children_cpu()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        wall.append(time.perf_counter() - start)
        cpu.append(_children_cpu() - cpu_start)
    return wall, cpu


def main() -> None:
    print(f"{'what':<44} {'median':>10} {'max':>10}")
    for preset in ("v4-flash", "v4-pro"):
        wall, cpu = time_command(preset)
        for label, times in (
            (f"plan in process ({preset})", time_in_process(preset)),
            (f"`dsv4ctl plan` command, wall ({preset})", wall),
            (f"`dsv4ctl plan` command, CPU ({preset})", cpu),
        ):
            median, most = statistics.median(times) * 1e3, max(times) * 1e3
            print(f"{label:<44} {median:>8.2f}ms {most:>8.2f}ms")


if __name__ == "__main__":
    main()
