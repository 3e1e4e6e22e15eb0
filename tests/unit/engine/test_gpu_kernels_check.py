"""bench/gpu_kernels_check.py never reports success without having run on CUDA."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_without_cuda_it_exits_non_zero_and_says_why():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no device, even on a GPU machine
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_kernels_check.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "no CUDA device here" in proc.stderr and "nothing was checked" in proc.stderr
    assert proc.stdout == ""
