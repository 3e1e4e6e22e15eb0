"""The local runtime never hands a port to two of its processes: the kernel gives a port out
again as soon as the socket that found it free closes, and an engine binds its port only once
it has started (seconds, in a container).  Two canary pods started 11 ms apart were once both
given 32963; the second engine then failed to bind, restart after restart."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dsv4_dev.localrun import runtime as runtime_module
from dsv4_dev.localrun.runtime import LocalRuntime, Process


def kernel_answers(monkeypatch: pytest.MonkeyPatch, ports: list[int]) -> None:
    """`free_port` answers ``ports`` in turn, as a kernel that reuses freed ports may."""
    answers: Iterator[int] = iter(ports)
    monkeypatch.setattr(runtime_module, "free_port", lambda: next(answers))


def running(port: int, bootstrap: int | None) -> Process:
    return Process(
        pod_uid=f"uid-{port}",
        pod=f"pod-{port}",
        namespace="serving",
        instance="flash",
        component="prefill",
        url=f"http://127.0.0.1:{port}",
        popen=None,  # type: ignore[arg-type]  # only its ports are read
        bootstrap_port=bootstrap,
    )


def test_a_port_a_running_process_holds_is_never_handed_out_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    runtime = LocalRuntime(core=None, workdir=tmp_path)
    runtime.processes["uid-30000"] = running(30000, 30001)
    kernel_answers(monkeypatch, [30000, 30001, 30002, 30003])
    assert runtime._free_ports(2) == [30002, 30003]


def test_one_pods_engine_and_bootstrap_ports_differ(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    runtime = LocalRuntime(core=None, workdir=tmp_path)
    kernel_answers(monkeypatch, [40000, 40000, 40001])
    assert runtime._free_ports(2) == [40000, 40001]
