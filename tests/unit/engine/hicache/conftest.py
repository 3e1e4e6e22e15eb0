"""Shared setup of the pool / HiCache / kernel / race tests."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def _one_torch_thread():
    """These tests move kilobytes: on 2 shared cores, torch's thread pool only adds barrier
    waits (a 0.1 ms copy took 3 ms with 2 threads), and the race tests need steady timing."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)
