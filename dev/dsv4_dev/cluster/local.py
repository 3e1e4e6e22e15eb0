"""Drive a local cluster through kwokctl's binary runtime (no containers needed).

kwokctl starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler and the KWOK
controller as plain processes from the binaries we built; we then register the fake
Blackwell nodes.  Every operation is idempotent so `up` can be re-run after a crash and
`down` can be run on a half-started cluster.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsv4_dev.cluster import pod_network
from dsv4_dev.cluster.binaries import (
    CONTROL_PLANE,
    cache_dir,
    control_plane_binary,
    kubectl,
)
from dsv4_dev.cluster.established import established
from dsv4_dev.cluster.lws import LwsController
from dsv4_dev.cluster.nodes import (
    GPU_CLIQUE_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    KWOK_ANNOTATION,
    NodePool,
    default_pools,
    node_manifests,
)

READY_TIMEOUT_S = 120.0
SERVICE_IP_RANGE = "10.96.0.0/16"
# The node lifecycle controller's taints for a node that is not Ready or not heard from.
CONDITION_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})
NODES_PER_APPLY = 100
# A kube-apiserver just started on a loaded machine may drop a connection before it serves
# steadily (kubectl: `Get ".../openapi/v2": EOF`); an apply of nodes is tried again.
APPLY_ATTEMPTS = 5
TRANSIENT = ("EOF", "connection refused", "connection reset")


class ClusterError(RuntimeError):
    """A cluster operation failed; the message says what and where to look."""


@dataclass
class LocalCluster:
    name: str = "dsv4"
    workdir: Path = field(default_factory=lambda: cache_dir() / "kwok")
    pools: list[NodePool] = field(default_factory=default_pools)
    apiserver_port: int | None = None
    # The controller manager's and scheduler's client rate (QPS; burst twice that).  Their
    # defaults (20 and 50) suit a small cluster; a large one raises them, as operators of
    # thousand-node clusters do, or node set-up and pod creation queue behind the limiter.
    # None: the components' defaults.
    controller_qps: int | None = None

    # -- paths -------------------------------------------------------------------------
    @property
    def cluster_dir(self) -> Path:
        return self.workdir / "clusters" / self.name

    @property
    def kubeconfig_path(self) -> Path:
        return self.cluster_dir / "kubeconfig.yaml"

    @property
    def kubeconfig(self) -> str:
        return str(self.kubeconfig_path)

    @property
    def gpu_nodes(self) -> list[str]:
        """Names of the fake GPU nodes, in the order `up` registers them."""
        return [
            n["metadata"]["name"]
            for n in node_manifests(self.pools)
            if GPU_PRODUCT_LABEL in n["metadata"]["labels"]
        ]

    @property
    def audit_log(self) -> Path:
        """Every API request, one JSON line each: how tests count an operator's writes."""
        return self.cluster_dir / "logs" / "audit.log"

    @property
    def lws(self) -> LwsController:
        """The LeaderWorkerSet controller of this cluster (its state in the cluster's folder,
        so `down` stops it with everything else)."""
        return LwsController(
            self.cluster_dir / "lws", self.cluster_dir / "logs", self.kubeconfig, self.kubectl
        )

    @property
    def pod_network_claims(self) -> Path:
        """Where every cluster of this machine claims its pods' loopback /16 (`pod_network`)."""
        return cache_dir() / "pod-networks"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": self.kubeconfig}

    # -- lifecycle ---------------------------------------------------------------------
    def up(self, log: Any = print) -> None:
        """Start the cluster (or finish starting it) and register the fake nodes."""
        binaries = {name: control_plane_binary(name).resolve() for name in CONTROL_PLANE}
        if self.exists() and self.reachable() and self._plays_pod_ips():
            log(f"cluster {self.name}: already running")
        else:
            if self.exists():
                log(
                    f"cluster {self.name}: found stopped, broken or made without local pod IPs, recreating"
                )
                self._kwokctl("delete", "cluster")
            self._check_port_free()
            log(f"cluster {self.name}: starting control plane")
            self._create(binaries)
        self._register_nodes()
        self._publish_pod_network(log)
        self._wait_nodes_ready()
        self.lws.state_dir.mkdir(parents=True, exist_ok=True)
        self.lws.up(log)
        log(f"cluster {self.name}: ready, kubeconfig {self.kubeconfig}")

    def down(self, log: Any = print) -> None:
        """Stop every process the cluster started and remove its state."""
        if self.exists():
            self._kwokctl("delete", "cluster")
            log(f"cluster {self.name}: deleted")
        else:
            log(f"cluster {self.name}: not running")
        pod_network.release(self.pod_network_claims, self.cluster_dir)
        killed = self.leftover_pids()
        for pid in killed:
            with contextlib.suppress(ProcessLookupError):  # it exited since the scan
                os.kill(pid, signal.SIGKILL)
            log(f"cluster {self.name}: killed leftover process {pid}")
        # A killed process is gone only once the kernel has torn it down: wait for that,
        # bounded, so `down` returning means nothing of the cluster runs.
        deadline = time.monotonic() + 10
        while killed and self.leftover_pids() and time.monotonic() < deadline:
            time.sleep(0.1)

    def exists(self) -> bool:
        return (self.cluster_dir / "kwok.yaml").exists()

    def reachable(self) -> bool:
        if not self.kubeconfig_path.exists():
            return False
        result = self.kubectl("get", "--raw", "/readyz", check=False, timeout=10)
        return result.returncode == 0 and result.stdout.strip() == "ok"

    def leftover_pids(self) -> list[int]:
        """Processes still running from this cluster's folder (none after a clean `down`)."""
        marker = str(self.cluster_dir)
        pids = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if marker in cmdline:
                pids.append(int(proc.name))
        return pids

    def status(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "name": self.name,
            "kubeconfig": self.kubeconfig,
            "exists": self.exists(),
            "reachable": False,
            "lwsController": self.lws.running(),
            "nodes": [],
        }
        if info["exists"] and self.reachable():
            info["reachable"] = True
            info["nodes"] = [
                {
                    "name": n["metadata"]["name"],
                    "ready": _node_ready(n),
                    "gpuProduct": n["metadata"].get("labels", {}).get(GPU_PRODUCT_LABEL),
                    "gpus": n["status"].get("allocatable", {}).get(GPU_RESOURCE, "0"),
                    "clique": n["metadata"].get("labels", {}).get(GPU_CLIQUE_LABEL),
                }
                for n in self._nodes()
            ]
        return info

    # -- kubectl -------------------------------------------------------------------------
    def kubectl(
        self,
        *args: str,
        check: bool = True,
        input: str | None = None,  # noqa: A002 - mirrors subprocess.run
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        cmd = [str(kubectl()), "--kubeconfig", self.kubeconfig, *args]
        result = subprocess.run(
            cmd, capture_output=True, text=True, input=input, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result

    def wait_established(self, crd: str, timeout: float = 60) -> None:
        why = established(self.kubectl, crd, timeout)
        if why is not None:
            raise ClusterError(why)

    # -- internals -----------------------------------------------------------------------
    def _nodes(self) -> list[dict[str, Any]]:
        return json.loads(self.kubectl("get", "nodes", "-o", "json").stdout)["items"]

    def _kwokctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(control_plane_binary("kwokctl")), "--name", self.name, *args]
        env = {**os.environ, "KWOK_WORKDIR": str(self.workdir)}
        result = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if check and result.returncode != 0:
            raise ClusterError(
                f"kwokctl {' '.join(args)} failed (exit {result.returncode}); "
                f"component logs are in {self.cluster_dir / 'logs'}:\n{_last_lines(result.stderr)}"
            )
        return result

    def _create(self, binaries: dict[str, Path]) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        policy = self.workdir / "audit-policy.yaml"
        policy.write_text(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n  omitStages: [RequestReceived]\n"
        )
        args = [
            "create",
            "cluster",
            "--runtime=binary",
            f"--kube-apiserver-binary={binaries['kube-apiserver']}",
            f"--kube-controller-manager-binary={binaries['kube-controller-manager']}",
            f"--kube-scheduler-binary={binaries['kube-scheduler']}",
            f"--etcd-binary={binaries['etcd']}",
            f"--kwok-controller-binary={binaries['kwok']}",
            f"--kubeconfig={self.workdir / 'kubeconfig-all.yaml'}",
            f"--kube-audit-policy={policy}",
            "--wait=2m",
        ]
        if self.apiserver_port:
            args.append(f"--kube-apiserver-port={self.apiserver_port}")
        args += _extra_args(self._component_flags())
        try:
            with _one_create_at_a_time():
                self._kwokctl(*args)
                self._annotated_pod_ips()
        except ClusterError:
            # Leave nothing half-started behind: a failed `up` is followed by a clean slate.
            self._kwokctl("delete", "cluster", check=False)
            raise

    def _plays_pod_ips(self) -> bool:
        """Whether the cluster's KWOK gives pods the IPs the local runtime picks."""
        path = self.cluster_dir / "kwok.yaml"
        return path.exists() and pod_network.POD_IP_ANNOTATION in path.read_text()

    def _annotated_pod_ips(self) -> None:
        """KWOK's pod-ready stage, patched to give a pod the IP the local runtime wrote into
        it (`pod_network`), then the cluster restarted to run it: kwokctl saves the stages
        it starts KWOK with, and KWOK reads them only as it starts."""
        path = self.cluster_dir / "kwok.yaml"
        try:
            patched = pod_network.annotated_pod_ips(path.read_text())
        except ValueError as err:
            raise ClusterError(f"{path}: {err}") from None
        if patched is None:
            return
        path.write_text(patched)
        self._kwokctl("stop", "cluster")
        self._kwokctl("start", "cluster")

    def _publish_pod_network(self, log: Any) -> None:
        """Tell the local runtime which addresses it hands out (`pod_network.PUBLISHED`)."""
        slot = pod_network.claim(self.pod_network_claims, self.cluster_dir)
        routed = pod_network.local_route()
        if not routed:
            log(
                f"cluster {self.name}: cannot route {pod_network.NETWORK} to this machine "
                "(no CAP_NET_ADMIN): its local runtime's pods take loopback IPs, which "
                "EndpointSlices refuse"
            )
        namespace, name = pod_network.PUBLISHED
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace},
            "data": {pod_network.RANGE_KEY: pod_network.runtime_range(slot, routed)},
        }
        self.kubectl("apply", "-f", "-", input=json.dumps(body))

    def _component_flags(self) -> dict[str, dict[str, str]]:
        # Room for thousands of ClusterIP Services (kube-apiserver's default, a /24, holds
        # 254: one router per deployment fills it at a few hundred), as kubeadm's default does.
        # One controller manager and one scheduler, so no leader election (as the LWS
        # controller runs): on by default, each renews its Lease every 2 s, 59 of an idle
        # cluster's 107 requests a minute, paid by every cluster a test session keeps up.
        controller = {"leader-elect": "false"}
        if self.controller_qps:
            controller["kube-api-qps"] = str(self.controller_qps)
            controller["kube-api-burst"] = str(2 * self.controller_qps)
        return {
            "kube-apiserver": {"service-cluster-ip-range": SERVICE_IP_RANGE},
            "kube-controller-manager": controller,
            "kube-scheduler": controller,
        }

    def _check_port_free(self) -> None:
        if not self.apiserver_port:
            return
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", self.apiserver_port))
            except OSError as err:
                raise ClusterError(
                    f"port {self.apiserver_port} for kube-apiserver is already in use "
                    f"({err.strerror}); choose another with --port or stop what holds it"
                ) from None

    def apply_retrying(self, doc: str) -> None:
        """`kubectl apply` of ``doc`` (idempotent), again after a transient failure
        (``TRANSIENT``), at most APPLY_ATTEMPTS times; any other failure at once."""
        for attempt in range(APPLY_ATTEMPTS):
            result = self.kubectl("apply", "-f", "-", input=doc, check=False)
            if result.returncode == 0:
                return
            last = attempt == APPLY_ATTEMPTS - 1
            if last or not any(t in result.stderr for t in TRANSIENT):
                raise ClusterError(f"kubectl apply -f - failed: {result.stderr.strip()}")
            time.sleep(2**attempt)

    def _register_nodes(self) -> None:
        desired = node_manifests(self.pools)
        # In batches: each kubectl call stays well inside its timeout at a thousand nodes.
        for start in range(0, len(desired), NODES_PER_APPLY):
            batch = desired[start : start + NODES_PER_APPLY]
            doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": batch})
            self.apply_retrying(doc)
        wanted = {n["metadata"]["name"] for n in desired}
        stale = [
            n["metadata"]["name"]
            for n in self._nodes()
            if n["metadata"].get("annotations", {}).get(KWOK_ANNOTATION) == "fake"
            and n["metadata"]["name"] not in wanted
        ]
        if stale:
            self.kubectl("delete", "node", *stale)

    def _wait_nodes_ready(self) -> None:
        """Until every node is Ready *and* schedulable: the API server taints a new node
        not-ready (TaintNodesByCondition) and the node lifecycle controller lifts the taint
        only after it has seen the node Ready, one node at a time at its client's rate, so
        at a thousand nodes the last ones take pods minutes after they report Ready."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            nodes = self._nodes()
            waiting = [n["metadata"]["name"] for n in nodes if not _node_schedulable(n)]
            if not waiting and nodes:
                return
            if time.monotonic() > deadline:
                shown = ", ".join(waiting[:10]) + (
                    f" and {len(waiting) - 10} more" if len(waiting) > 10 else ""
                )
                raise ClusterError(
                    f"nodes not Ready and schedulable after {READY_TIMEOUT_S:.0f}s: {shown}; "
                    f"see {self.cluster_dir / 'logs'} (kwok-controller.log, "
                    "kube-controller-manager.log)"
                )
            time.sleep(0.5)


def _extra_args(flags: dict[str, dict[str, str]]) -> list[str]:
    """kwokctl's --extra-args for each component's flags, in rounds: every component's first
    flag, then every second one, ...  kwokctl v0.8.0 files a component's later flags under
    the index its first flag had among all of them, which points past the list of components
    (a panic) unless each component's first flag comes in the order of its first appearance."""
    rounds = [list(component.items()) for component in flags.values()]
    return [
        f"--extra-args={name}={items[i][0]}={items[i][1]}"
        for i in range(max(map(len, rounds), default=0))
        for name, items in zip(flags, rounds, strict=True)
        if i < len(items)
    ]


def _node_ready(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _node_schedulable(node: dict[str, Any]) -> bool:
    """Ready, and without the taints a node carries while it is not (yet) seen Ready."""
    taints = node.get("spec", {}).get("taints") or []
    return _node_ready(node) and not any(t.get("key") in CONDITION_TAINTS for t in taints)


def _last_lines(text: str, count: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-count:])


@contextlib.contextmanager
def _one_create_at_a_time() -> Iterator[None]:
    """kwokctl picks each component's port by counting down from 32767 to the first one free
    *now*, and binds it only when the component starts: two clusters created at once (the
    two e2e workers of `make test`, a developer's cluster beside a test's) pick the same
    ports.  A machine-wide lock held until `create --wait` returns, when every component
    listens, makes the second creation see the first one's ports taken."""
    cache_dir().mkdir(parents=True, exist_ok=True)
    with (cache_dir() / "cluster-create.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
