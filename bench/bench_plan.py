"""How long `dsv4ctl plan` takes: it must stay interactive (well under a second).

Prints the in-process time of one full plan (pools, HiCache host bytes, legacy compare)
and the wall time of the whole command as a user runs it (interpreter start and imports
included).
"""

from __future__ import annotations

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
from dsv4_engine.features import IndexDtype
from dsv4_engine.presets import preset_config


def one_plan(preset: str) -> None:
    model = model_spec_from_hf_config(preset_config(preset))
    settings = EngineSettings(index_dtype=IndexDtype.BF16, tp_size=4)
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


def time_command(preset: str, runs: int = 5) -> list[float]:
    argv = [
        sys.executable, "-m", "dsv4_operator.cli.main", "plan", "--preset", preset,
        "--gpu-memory", "180GiB", "--tp", "4", "--index-dtype", "bf16",
        "--hicache-ratio", "2", "--legacy-compare",
    ]  # fmt: skip
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    print(f"{'what':<44} {'median':>10} {'max':>10}")
    for preset in ("v4-flash", "v4-pro"):
        for label, times in (
            (f"plan in process ({preset})", time_in_process(preset)),
            (f"`dsv4ctl plan` command ({preset})", time_command(preset)),
        ):
            print(
                f"{label:<44} {statistics.median(times) * 1e3:>8.2f}ms {max(times) * 1e3:>8.2f}ms"
            )


if __name__ == "__main__":
    main()
