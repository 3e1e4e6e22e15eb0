"""Engine tests' reporting: the kernels' compile times, printed after the run."""

from __future__ import annotations

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line per kernel and target compiled by test_kernel_targets (workers' reports
    carry it in `user_properties`, so this holds under pytest-xdist too)."""
    rows = [
        value
        for report in terminalreporter.stats.get("passed", [])
        for key, value in getattr(report, "user_properties", [])
        if key == "kernel_compile"
    ]
    if not rows:
        return
    terminalreporter.section("Triton kernels compiled for each target (no GPU)")
    for row in sorted(rows, key=lambda r: (r["case"], r["target"])):
        terminalreporter.write_line(
            f"{row['case']:<32} {row['target']:<6} {row['seconds']:6.2f} s  "
            f"{row['registers']:>3} regs  {row['shared_bytes']:>6} B shared  "
            f"{row['spilled_bytes']} B spilled  {row['mma_instructions']} mma"
        )
    total = sum(r["seconds"] for r in rows)
    terminalreporter.write_line(
        f"{len(rows)} compiles, {total:.1f} s (0 when Triton's cache had them)"
    )
