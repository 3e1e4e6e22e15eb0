"""The local runtime plays sglang-router's discovery: a router serves exactly the engines
its rendered selectors match — its own slot, its own transfer format — and is told when
they change, in place."""

from __future__ import annotations

from pathlib import Path

from dsv4_dev.localrun.runtime import LocalRuntime, Process, _selector
from dsv4_engine.features import Role
from dsv4_operator.api.rollout import Slot
from dsv4_operator.api.samples import load_sample
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.render.meta import LABEL_GROUP_ROLE, Owner
from dsv4_operator.render.router import router_args
from dsv4_operator.render.workloads import engine_pod_labels

OWNER = Owner("flash", "serving", "u")
SPEC = DSV4DeploymentSpec.model_validate(load_sample()["spec"])


def engine(role: Role, slot: Slot, transfer: str, port: int) -> Process:
    labels = {**engine_pod_labels(OWNER, role, slot, transfer), LABEL_GROUP_ROLE: "leader"}
    return Process(
        pod_uid=f"{role}-{slot}-{transfer}",
        pod=f"flash-{role}-{slot}",
        namespace="serving",
        instance="flash",
        component=role.value,
        url=f"http://127.0.0.1:{port}",
        popen=None,  # type: ignore[arg-type]  # no process: health is answered below
        bootstrap_port=port + 1 if role is Role.PREFILL else None,
        labels=labels,
    )


def test_a_router_discovers_only_its_slots_engines_of_its_format(tmp_path: Path):
    runtime = LocalRuntime(core=None, workdir=tmp_path)
    runtime._healthy = lambda process: True  # type: ignore[method-assign]
    for p in (
        engine(Role.PREFILL, Slot.BLUE, "old", 100),
        engine(Role.DECODE, Slot.BLUE, "old", 200),
        engine(Role.PREFILL, Slot.GREEN, "new", 300),
        engine(Role.DECODE, Slot.GREEN, "new", 400),
    ):
        runtime.processes[p.pod_uid] = p
    for slot, transfer, ports in ((Slot.BLUE, "old", (100, 200)), (Slot.GREEN, "new", (300, 400))):
        args = router_args(OWNER, SPEC, slot, transfer)
        selectors = (_selector(args, "--prefill-selector"), _selector(args, "--decode-selector"))
        prefill, decode = runtime._discovered("serving", selectors)
        assert prefill == (f"http://127.0.0.1:{ports[0]} {ports[0] + 1}",)
        assert decode == (f"http://127.0.0.1:{ports[1]}",)
