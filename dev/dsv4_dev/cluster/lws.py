"""The LeaderWorkerSet controller (kubernetes-sigs/lws) of the local cluster, as a process.

In a real cluster LWS runs as a Deployment whose webhooks the API server reaches through a
Service, with certificates from cert-controller.  Here every component is a local process
and KWOK pods run nothing, so the controller runs beside kube-apiserver: internal cert
management off, its webhook server on 127.0.0.1 with a self-signed certificate (openssl),
and the release's own webhook manifest installed with `clientConfig.url` pointing at it.
The webhooks matter: LWS's pod webhook is what gives each pod of a group its
`LWS_LEADER_ADDRESS` / `LWS_WORKER_INDEX` / `LWS_GROUP_SIZE` and its group labels.
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from dsv4_dev.cluster.binaries import MissingBinaryError, lws_file
from dsv4_dev.cluster.established import established

CONTROLLER = "lws-controller"
CRD_FILES = (
    "crds/leaderworkerset.x-k8s.io_leaderworkersets.yaml",
    "crds/disaggregatedset.x-k8s.io_disaggregatedsets.yaml",
)
WEBHOOKS_FILE = "webhook-manifests.yaml"
# LWS's own kustomize patch narrows the pod webhooks to LWS pods; without it every pod
# create in the cluster would depend on this process.
LWS_POD_SELECTOR = {
    "matchExpressions": [{"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}]
}
READY_TIMEOUT_S = 60.0

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


class LwsError(RuntimeError):
    """The LWS controller did not come up; the message says where to look."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def webhook_configurations(manifest: str, port: int, ca_bundle: bytes) -> list[dict[str, Any]]:
    """LWS's webhook configurations, re-pointed from its in-cluster Service to the local
    process; the pod webhooks only see LWS pods (as LWS's own patch makes them)."""
    configs = [doc for doc in yaml.safe_load_all(manifest) if doc]
    for config in configs:
        config["metadata"]["name"] = f"lws-{config['metadata']['name']}"
        for hook in config["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}{path}",
                "caBundle": base64.b64encode(ca_bundle).decode(),
            }
            if any("pods" in rule["resources"] for rule in hook["rules"]):
                hook["objectSelector"] = LWS_POD_SELECTOR
    return configs


def controller_configuration(webhook_port: int, health_port: int, cert_dir: Path) -> dict:
    return {
        "apiVersion": "config.lws.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
    }


class LwsController:
    """Start (idempotently) and describe the LWS controller of one local cluster."""

    def __init__(self, state_dir: Path, log_dir: Path, kubeconfig: str, kubectl: Kubectl) -> None:
        self.state_dir = state_dir  # inside the cluster's folder: `down` finds the process
        self.log_path = log_dir / f"{CONTROLLER}.log"
        self.kubeconfig = kubeconfig
        self.kubectl = kubectl

    @property
    def pid_file(self) -> Path:
        return self.state_dir / "pid"

    def running(self) -> bool:
        try:
            pid = int(self.pid_file.read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return False
        return str(self.state_dir).encode() in cmdline

    def up(self, log: Callable[[str], None]) -> None:
        """CRDs, then the controller, then the webhooks that point at it."""
        binary = lws_file(CONTROLLER)
        self._install_crds()
        if self.running():
            log("lws: controller already running")
            return
        webhook_port, health_port = free_port(), free_port()
        cert_dir = self.state_dir / "certs"
        ca = self._certificate(cert_dir)
        config_path = self.state_dir / "config.yaml"
        config_path.write_text(
            yaml.safe_dump(controller_configuration(webhook_port, health_port, cert_dir))
        )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            proc = subprocess.Popen(
                [str(binary), "--config", str(config_path), "--kubeconfig", self.kubeconfig],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.pid_file.write_text(str(proc.pid))
        manifest = lws_file(WEBHOOKS_FILE).read_text()
        configs = webhook_configurations(manifest, webhook_port, ca)
        items = {"apiVersion": "v1", "kind": "List", "items": configs}
        self.kubectl("apply", "-f", "-", input=json.dumps(items))
        self._wait_serving(proc)
        log(f"lws: controller running (pid {proc.pid}, webhooks on 127.0.0.1:{webhook_port})")

    def _install_crds(self) -> None:
        for name in CRD_FILES:
            self.kubectl("apply", "--server-side", "-f", str(lws_file(name)))
        why = established(self.kubectl, "crd/leaderworkersets.leaderworkerset.x-k8s.io")
        if why is not None:
            raise LwsError(why)

    def _certificate(self, cert_dir: Path) -> bytes:
        """A self-signed serving certificate for 127.0.0.1; it is also the CA bundle."""
        cert_dir.mkdir(parents=True, exist_ok=True)
        crt, key = cert_dir / "tls.crt", cert_dir / "tls.key"
        if not crt.exists():
            try:
                subprocess.run(
                    [
                        "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                        "-keyout", str(key), "-out", str(crt), "-days", "3650",
                        "-subj", "/CN=lws-webhook", "-addext", "subjectAltName=IP:127.0.0.1",
                    ],
                    check=True,
                    capture_output=True,
                )  # fmt: skip
            except FileNotFoundError:
                raise MissingBinaryError(
                    "openssl not found on PATH; it signs the local LWS webhook certificate "
                    "(Debian package openssl)"
                ) from None
        return crt.read_bytes()

    def _wait_serving(self, proc: subprocess.Popen[bytes]) -> None:
        """Until a server-side dry run of a LeaderWorkerSet passes LWS's own webhooks."""
        probe = {
            "apiVersion": "leaderworkerset.x-k8s.io/v1",
            "kind": "LeaderWorkerSet",
            "metadata": {"name": "lws-webhook-probe", "namespace": "default"},
            "spec": {
                "leaderWorkerTemplate": {
                    "size": 2,
                    "workerTemplate": {"spec": {"containers": [{"name": "c", "image": "probe"}]}},
                }
            },
        }
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise LwsError(f"lws-controller exited with {proc.returncode}; see {self.log_path}")
            result = self.kubectl(
                "create", "--dry-run=server", "-f", "-", input=json.dumps(probe), check=False
            )
            if result.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise LwsError(
                    f"LWS webhooks not serving after {READY_TIMEOUT_S:.0f}s "
                    f"({result.stderr.strip()}); see {self.log_path}"
                )
            time.sleep(0.5)
