"""Shared setup of the pool / HiCache / kernel / race tests."""

import os
import sys

import pytest
import torch

from dsv4_engine.kernels import get_ops

TRITON_MODULES = (
    "dsv4_engine.kernels.index_k_triton",
    "dsv4_engine.kernels.paged_copy_triton",
    "dsv4_engine.kernels.topk_triton",
)


@pytest.fixture(autouse=True, scope="package")
def _one_torch_thread():
    """These tests move kilobytes: on 2 shared cores, torch's thread pool only adds barrier
    waits (a 0.1 ms copy took 3 ms with 2 threads), and the race tests need steady timing."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def _forget_kernel_modules() -> None:
    """Make the next import of each kernel module decorate its kernels anew (another test
    may have imported them compiled for a GPU): out of `sys.modules`, and off the package,
    whose attribute `from dsv4_engine.kernels import ...` would otherwise hand back."""
    package = sys.modules["dsv4_engine.kernels"]
    for name in TRITON_MODULES:
        sys.modules.pop(name, None)
        package.__dict__.pop(name.rsplit(".", 1)[1], None)


@pytest.fixture(scope="module")
def kernel_device() -> str:
    """Where the Triton kernels' tests put their tensors: compiled kernels take CUDA tensors
    only, the interpreter CPU tensors."""
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def triton_backend(kernel_device):
    """The Triton kernels: native on CUDA, else decorated and run under Triton's CPU
    interpreter (TRITON_INTERPRET=1, read when @triton.jit decorates and when it runs) for
    this module only.  Yields the backend name for `get_ops` / `DevicePool(backend=)`."""
    if kernel_device == "cuda":
        yield "triton"
        return
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    _forget_kernel_modules()
    try:
        yield "triton"
    finally:
        _forget_kernel_modules()
        if saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = saved


@pytest.fixture(scope="module")
def triton_ops(triton_backend):
    return get_ops(triton_backend)
