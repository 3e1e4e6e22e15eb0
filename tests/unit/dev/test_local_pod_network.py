"""Each pod the local runtime runs has an IP of its own on loopback, as a pod has a network
namespace of its own on a node: its processes bind the ports the operator rendered on it,
and sglang-router finds it where Kubernetes says it is (`dsv4_dev.cluster.pod_network`)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dsv4_dev.cluster import pod_network
from dsv4_dev.localrun import runtime as runtime_module
from dsv4_dev.localrun.readiness import GATE
from dsv4_dev.localrun.runtime import LocalRuntime, PodAddresses, Process, router_command
from dsv4_operator.api.rollout import Slot
from dsv4_operator.api.samples import load_sample
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.render.meta import LABEL_COMPONENT, Owner
from dsv4_operator.render.router import ROUTER_COMMAND, ROUTER_DRAIN_S, router_deployment

OWNER = Owner("flash", "serving", "u")
SPEC = DSV4DeploymentSpec.model_validate(load_sample()["spec"])
# KWOK v0.8.0's pod-ready stage, the lines around its pod IP (kustomize/stage/pod/fast).
KWOK_POD_READY = """\
      {{ $podIPs := PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
      {{ with $podIPs }}
      podIP: {{ index . 0 | Quote }}
"""


def test_clusters_side_by_side_claim_different_slots_and_a_gone_one_frees_its_own(tmp_path):
    claims = tmp_path / "claims"
    first, second = tmp_path / "a", tmp_path / "b"
    one, two = pod_network.claim(claims, first), pod_network.claim(claims, second)
    assert one != two and pod_network.claim(claims, first) == one  # a cluster keeps its own
    pod_network.release(claims, first)
    assert pod_network.claim(claims, tmp_path / "c") == one
    # A cluster folder removed without a release (a test's temporary folder) frees its slot.
    (second / pod_network.CLAIM_FILE).unlink()
    assert pod_network.claim(claims, tmp_path / "d") == two


def test_kwoks_pod_ready_stage_is_patched_to_honour_the_annotation_once():
    patched = pod_network.annotated_pod_ips(KWOK_POD_READY)
    assert patched is not None
    lines = patched.splitlines()
    override = lines[1]
    assert override.startswith("      {{ with .metadata.annotations }}")
    assert f'index . "{pod_network.POD_IP_ANNOTATION}"' in override
    assert "$podIPs = list ." in override
    assert pod_network.annotated_pod_ips(patched) is None  # already honoured
    with pytest.raises(ValueError, match="cannot patch"):
        pod_network.annotated_pod_ips("kind: Stage\n")


def test_each_slot_has_a_block_of_its_own_routed_or_on_loopback():
    blocks = [pod_network.runtime_range(slot) for slot in pod_network.SLOTS]
    assert blocks[0] == "198.18.0.0/21" and blocks[-1] == "198.19.248.0/21"
    assert len(set(blocks)) == len(blocks) == 64
    assert pod_network.runtime_range(3, routed=False) == "127.4.0.0/16"


def test_addresses_skip_those_taken():
    addresses = PodAddresses(pod_network.runtime_range(4))
    assert addresses.pick(set()) == "198.18.32.1"
    assert addresses.pick({"198.18.32.1", "198.18.32.2"}) == "198.18.32.3"


def test_a_router_pod_runs_its_rendered_command_bound_to_its_ip():
    """The one change: every address it binds is the pod's (its API port and its metrics
    port, which sglang-router binds on all interfaces by default), and `python3` is this
    venv's.  Its arguments, selectors included, are the operator's."""
    container = router_deployment(OWNER, SPEC, Slot.BLUE, "t")["spec"]["template"]["spec"][
        "containers"
    ][0]
    command = router_command(container["command"], container["args"], "127.4.128.9")
    assert command[:3] == [sys.executable, *ROUTER_COMMAND[1:]]
    rendered = container["args"]
    assert command[3 : 3 + len(rendered)] == [
        "127.4.128.9" if rendered[i - 1] == "--host" else arg for i, arg in enumerate(rendered)
    ]
    assert command[3 + len(rendered) :] == ["--prometheus-host", "127.4.128.9"]


class FakeCore:
    """What `_start_router` asks the API server: a pod's annotation, an account's token."""

    def __init__(self) -> None:
        self.annotated: dict[str, str] = {}

    def patch_namespaced_pod(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        self.annotated[name] = body["metadata"]["annotations"][pod_network.POD_IP_ANNOTATION]

    def create_namespaced_service_account_token(self, *_: Any) -> Any:
        return SimpleNamespace(status=SimpleNamespace(token="t"))


def router_pod(uid: str, annotations: dict[str, str] | None = None) -> Any:
    container = router_deployment(OWNER, SPEC, Slot.BLUE, "t")["spec"]["template"]["spec"][
        "containers"
    ][0]
    return SimpleNamespace(
        metadata=SimpleNamespace(
            uid=uid, name=uid, namespace="serving", labels={LABEL_COMPONENT: "router"},
            annotations=annotations,
        ),
        spec=SimpleNamespace(
            containers=[SimpleNamespace(
                command=container["command"], args=container["args"], readiness_probe=None,
                lifecycle=SimpleNamespace(pre_stop=SimpleNamespace(
                    sleep=SimpleNamespace(**container["lifecycle"]["preStop"]["sleep"])
                )),
            )],
            scheduling_gates=[SimpleNamespace(name=GATE)],
            service_account_name="flash-router",
            subdomain=None,
        ),
        status=SimpleNamespace(pod_ip=None),
    )  # fmt: skip


def test_two_routers_started_back_to_back_get_two_ips_and_a_draining_one_gives_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Through the runtime's own start of two gated router pods (the processes are not
    started): each is given an IP of its own, written into the pod for KWOK to report.  A
    process still draining on an IP the new pod is given is stopped first."""
    kubeconfig = tmp_path / "admin.kubeconfig"
    monkeypatch.setattr(runtime_module.accounts, "token_kubeconfig", lambda *a: {"k": "v"})
    started: list[list[str]] = []
    monkeypatch.setattr(
        runtime_module.processes, "popen", lambda command, env, log: started.append(command)
    )
    stopped: list[str] = []
    core = FakeCore()
    runtime = LocalRuntime(
        core=core, workdir=tmp_path, addresses=PodAddresses("127.5.128.0/30"), kubeconfig=kubeconfig
    )
    runtime._stop = lambda process: stopped.append(process.ip)  # type: ignore[method-assign]
    for uid in ("router-a", "router-b"):
        runtime._start_router(router_pod(uid))
    assert core.annotated == {"router-a": "127.5.128.1", "router-b": "127.5.128.2"}
    assert {runtime.processes[u].url for u in core.annotated} == {
        "http://127.5.128.1:8000",
        "http://127.5.128.2:8000",
    }
    # Each drains through its rendered preStop sleep once its pod is marked for deletion.
    assert {p.drain_s for p in runtime.processes.values()} == {ROUTER_DRAIN_S}
    # router-a's pod is gone; its process drains.  A pod given its IP again takes it over.
    runtime._draining.append((float("inf"), runtime.processes.pop("router-a")))
    runtime._start_router(router_pod("router-c", {pod_network.POD_IP_ANNOTATION: "127.5.128.1"}))
    assert stopped == ["127.5.128.1"] and not runtime._draining
    assert len(started) == 3


def test_a_process_keeps_its_pods_address(tmp_path: Path):
    process = Process(
        pod_uid="u", pod="p", namespace="n", instance="i", component="decode",
        ip="127.5.128.9", url="http://127.5.128.9:30000", popen=None,  # type: ignore[arg-type]
    )  # fmt: skip
    assert process.port == 30000 and process.ip == "127.5.128.9"
