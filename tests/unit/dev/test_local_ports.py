"""The local runtime never hands a port to two of its processes: the kernel gives a port out
again as soon as the socket that found it free closes, and an engine binds its port only once
it has started (seconds, in a container).  Two canary pods started 11 ms apart were once both
given 32963; the second engine then failed to bind, restart after restart."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from dsv4_dev.localrun import runtime as runtime_module
from dsv4_dev.localrun.runtime import LocalRuntime, Process
from dsv4_engine.features import Role
from dsv4_operator.api.rollout import Slot
from dsv4_operator.render.meta import LABEL_COMPONENT
from dsv4_operator.render.router import router_args
from tests.unit.dev.test_local_router_discovery import OWNER, SPEC, engine


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


def test_two_routers_started_back_to_back_get_two_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Through the runtime's own start of a router pod (only the process is not started):
    the kernel answers the first router's port again for the second."""
    runtime = LocalRuntime(core=None, workdir=tmp_path)
    runtime._healthy = lambda process: True  # type: ignore[method-assign]
    for p in (engine(Role.PREFILL, Slot.BLUE, "t", 100), engine(Role.DECODE, Slot.BLUE, "t", 200)):
        runtime.processes[p.pod_uid] = p
    monkeypatch.setattr(runtime_module.processes, "popen", lambda command, env, log: None)
    kernel_answers(monkeypatch, [50000, 50000, 50001])
    args = router_args(OWNER, SPEC, Slot.BLUE, "t")
    for uid in ("router-a", "router-b"):
        pod = SimpleNamespace(
            metadata=SimpleNamespace(
                uid=uid, name=uid, namespace="serving", labels={LABEL_COMPONENT: "router"}
            ),
            spec=SimpleNamespace(containers=[SimpleNamespace(args=args)], subdomain=None),
        )
        runtime._start_router(pod)
    assert {runtime.processes[uid].port for uid in ("router-a", "router-b")} == {50000, 50001}
