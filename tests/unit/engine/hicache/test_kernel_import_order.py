"""The interpreted Triton kernels pass whatever the worker imported before them.

pytest-xdist hands a worker its tests in no order a test may rely on, and SGLang's import
(the in-process SGLang tests share one worker, `tests/conftest.py`) imports
`triton.language` compiled: had it come first, every interpreted kernel would fail.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent
ROOT = HERE.parents[3]


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the kernels run compiled")
def test_interpreted_kernels_pass_after_a_compiled_import_of_triton_language():
    kernels = HERE / "test_kernels.py"
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q",
         str(HERE / "triton_compiled_first.py"),
         f"{kernels}::test_store_writes_the_same_bytes_as_the_reference"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert child.returncode == 0, child.stdout[-4000:]
    assert "5 passed" in child.stdout, child.stdout[-2000:]
