"""Bounded waits on real API objects, shared by the end-to-end tests."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from dsv4_dev import images
from dsv4_dev.cluster.binaries import kubectl
from dsv4_dev.cluster.local import LocalCluster
from dsv4_dev.localrun import accounts
from dsv4_dev.localrun.probes import IMAGES_ENV
from dsv4_dev.localrun.runtime import READY, free_port
from dsv4_engine.probe.workload import ECHO_TOOL, document, echo_instruction, random_echo
from dsv4_operator.api.crd import CRD_PATH
from dsv4_operator.api.samples import shipped_sample
from dsv4_operator.runtime import OPERATOR_CONTAINER
from tests.e2e import kubectl_get
from tests.unit.operator.harness import MODEL_HOST_PATHS


def wait_for(
    what: str, probe: Callable[[], Any], timeout: float = 60.0, interval: float = 0.5
) -> Any:
    """Polls ``probe`` until it returns something truthy; fails with ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def get_json(cluster: LocalCluster, *args: str) -> dict[str, Any]:
    """What `kubectl get ARGS -o json` prints (read in process where it can: `kubectl_get`)."""
    return kubectl_get.get_json(cluster, *args)


def apply(cluster: LocalCluster, manifest: dict[str, Any], namespace: str = "default") -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest))


def audit_events(cluster: LocalCluster, offset: int) -> list[dict[str, Any]]:
    """Every request the API server's audit log recorded after byte `offset`, parsed."""
    with cluster.audit_log.open("rb") as log:
        log.seek(offset)
        lines = log.read().decode(errors="replace").splitlines()
    events = []
    for line in lines:
        with contextlib.suppress(ValueError):
            events.append(json.loads(line))
    return events


LOGGED_TIMEOUT_S = 120  # a background process's start, to the line it logs when ready


class Background:
    """A long-running process of a test (the operator, the local runtime), logging to a file;
    with ``ready``, `start` returns once the process has logged that line (after
    `LOGGED_TIMEOUT_S` it fails, with the log's tail)."""

    def __init__(
        self, command: list[str], log: Path, env: dict[str, str], ready: str | None = None
    ) -> None:
        self.command, self.log, self.env, self.ready = command, log, env, ready
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        offset = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(
                self.command, stdout=out, stderr=subprocess.STDOUT, env=self.env
            )
        if self.ready is not None:
            ready = self.ready

            def logged() -> bool:
                assert self.proc is not None and self.proc.poll() is None, (
                    f"{self.command} exited: {self.text()[-3000:]}"
                )
                return ready in self.text()[offset:]

            wait_for(f"{ready!r} in {self.log}", logged, LOGGED_TIMEOUT_S)

    def text(self) -> str:
        return self.log.read_text()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def operator_and_runtime(
    cluster: LocalCluster, namespace: str, logs: Path, *extra: str
) -> tuple[Background, Background]:
    """The operator for one namespace, and the local runtime that runs a reference engine for
    each engine pod of a `spec.engine: reference` deployment (both returned unstarted;
    ``extra``: more `run` flags)."""
    env = {**cluster.env, "DSV4_LOCALRUN_DIR": str(logs)}
    operator = Background(
        [
            sys.executable, "-m", "dsv4_dev.operator", "run",
            "--namespace", namespace, "--lease-namespace", namespace, "--lease-seconds", "6",
            "--local-endpoints", "--allowed-model-host-paths", ",".join(MODEL_HOST_PATHS),
            "--resync-seconds", "2", "--health-port", str(free_port()),
            *extra,
        ],
        logs / "operator.log",
        env,
    )  # fmt: skip
    return operator, local_runtime(cluster, logs)


def local_runtime(
    cluster: LocalCluster, logs: Path, images: dict[str, str] | None = None
) -> Background:
    """The local runtime (unstarted), its logs in ``logs``: a reference engine for each
    engine pod of a `spec.engine: reference` deployment, a router for each router pod, and
    each probe Job pod's command — from the local image ``images`` maps its image to."""
    env = {
        **cluster.env,
        "DSV4_LOCALRUN_DIR": str(logs),
        IMAGES_ENV: ",".join(f"{pod}={local}" for pod, local in (images or {}).items()),
    }
    return Background(
        [sys.executable, "-m", "dsv4_dev.localrun.runtime"], logs / "localrun.log", env, READY
    )


def dry_run_in_default(
    cluster: LocalCluster, obj: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    """A server-side dry run of ``obj`` in `default`: what admission says, nothing made."""
    return cluster.kubectl(
        "apply", "--dry-run=server", "-n", "default", "-f", "-", check=False, input=json.dumps(obj)
    )


@contextlib.contextmanager
def serving_reference_sample(
    cluster: LocalCluster, namespace: str, logs: Path, spec: dict[str, Any] | None = None
) -> Iterator[tuple[Background, Background]]:
    """The CRD, ``namespace``, its operator and the local runtime, and the shipped reference
    sample (`flash-reference`, its spec updated with ``spec``) applied there and Ready:
    what a module that rolls the sample out starts from.  The operator and runtime are
    yielded; on the way out the deployment is deleted and both are stopped."""
    operator, runtime = operator_and_runtime(cluster, namespace, logs)
    cluster.kubectl("apply", "--server-side", "-f", str(CRD_PATH))
    cluster.wait_established("crd/dsv4deployments.inference.dsv4.dev")
    cluster.kubectl("create", "namespace", namespace, check=False)
    operator.start()
    runtime.start()
    sample = shipped_sample("flash-reference")
    sample["spec"] = {**sample["spec"], **(spec or {})}
    name = sample["metadata"]["name"]
    try:
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(sample))

        def ready() -> bool:
            found = get_json(cluster, "dsv4", name, "-n", namespace)
            return (found.get("status") or {}).get("phase") == "Ready"

        wait_for(f"{name} Ready", ready, 180)
        yield operator, runtime
    finally:
        cluster.kubectl("delete", "dsv4", name, "-n", namespace, "--wait=false", check=False)
        operator.stop()
        runtime.stop()


def account_kubeconfig(
    cluster: LocalCluster,
    namespace: str,
    account: str,
    path: Path,
    pod: tuple[str, str] | None = None,
) -> Path:
    """A kubeconfig whose only credential is a fresh token of a ServiceAccount: the API
    server then judges every request by that account's RBAC, as for its pod.  ``pod``
    (name, uid) binds the token to that pod, as kubelet's are, and the API server then
    records the pod's name with each request it authenticates by it."""
    from kubernetes import client, config

    core = client.CoreV1Api(config.new_client_from_config(config_file=cluster.kubeconfig))
    token = accounts.request_token(core, namespace, account, pod)
    return accounts.write_kubeconfig(
        path, accounts.token_kubeconfig(cluster.kubeconfig, account, token)
    )


class RouterLoad:
    """Continuous chat requests to a deployment's router Service, through the local runtime's
    endpoint map (resolved per request, as a Service resolves per connection), from
    ``sessions`` concurrent sessions, until stopped: what users send through a promotion.

    Each session asks its own fixed question again and again.  An answer is *failed* when
    the request got no 200 with a message; an answer is *corrupt* when it is a third
    distinct one for its question — the old and the new flags may each answer their own
    way, but a prefill and a decode of different formats paired would garble it."""

    pause_s = 0.5  # between one answer and a session's next request

    def __init__(
        self, cluster: LocalCluster, namespace: str, service: str, sessions: int = 8
    ) -> None:
        from kubernetes import config as kube_config

        from dsv4_dev.localrun import endpoints
        from dsv4_operator.kube.client import Kube

        kube = Kube(kube_config.new_client_from_config(config_file=cluster.kubeconfig))
        self._resolve = lambda: endpoints.resolver(kube)(namespace, service, 8000)
        self.sessions = sessions
        self.ok = 0
        self.failed: list[str] = []
        self.answers: dict[int, set[str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self, serving_within: float = 60.0) -> None:
        """Start once the Service answers: what is measured is what users see of a rollout
        from a serving start.  (An earlier test may have stopped the local runtime, and its
        restart republishes the router only once the router answers again.)"""
        wait_for("the router Service to answer", self._serving, serving_within)
        self._thread.start()

    def _serving(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self._resolve()}/health", timeout=5) as response:
                return response.status == 200
        except (OSError, ValueError):
            return False

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)

    @property
    def corrupt(self) -> dict[int, set[str]]:
        return {i: found for i, found in self.answers.items() if len(found) > 2}

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            await asyncio.gather(*(self._session(http, i) for i in range(self.sessions)))

    def body(self, index: int) -> dict[str, Any]:
        """The request session ``index`` sends next."""
        return {
            "messages": [{"role": "user", "content": f"Session {index}: continue the story."}],
            "max_tokens": 4,
            "temperature": 0,
        }

    def record(self, index: int, answer: dict[str, Any]) -> None:
        """A 200 answer of session ``index``."""
        self.answers.setdefault(index, set()).add(answer["choices"][0]["message"]["content"])

    async def _session(self, http: aiohttp.ClientSession, index: int) -> None:
        while not self._stop.is_set():
            try:
                url = await asyncio.to_thread(self._resolve)
                async with http.post(f"{url}/v1/chat/completions", json=self.body(index)) as resp:
                    answer = await resp.json(content_type=None)
                    if resp.status != 200:
                        self.failed.append(f"HTTP {resp.status}: {answer}")
                    else:
                        self.record(index, answer)
                        self.ok += 1
            except (aiohttp.ClientError, ValueError, KeyError, TimeoutError) as err:
                self.failed.append(f"{type(err).__name__}: {err}")
            await asyncio.sleep(self.pause_s)


class ToolCallUsers(RouterLoad):
    """Agent-like users through the router Service: each session asks, again and again,
    for one call of the echo tool (`dsv4_engine.probe.workload`), under one of a few long
    system prompts that sessions share (as an agent's users share its system prompt), so
    prefixes are cached, evicted and loaded back as they are under real traffic.  What
    their answers are worth is the engines' to judge (their live counters), not theirs."""

    pause_s = 0.1

    def __init__(
        self, cluster: LocalCluster, namespace: str, service: str, sessions: int = 64
    ) -> None:
        super().__init__(cluster, namespace, service, sessions)
        self._rng = random.Random(f"users:{service}")
        self._prompts = [
            document(random.Random(f"users:{group}"), 200, f"U{group}") for group in range(8)
        ]

    def body(self, index: int) -> dict[str, Any]:
        echo = random_echo(self._rng)
        return {
            "messages": [
                {"role": "system", "content": self._prompts[index % len(self._prompts)]},
                {"role": "user", "content": echo_instruction(echo)},
            ],
            "tools": [ECHO_TOOL],
            "tool_choice": "auto",
            "max_tokens": 256,
            "temperature": 0,
        }

    def record(self, index: int, answer: dict[str, Any]) -> None:
        return None


def model_claim(cluster: LocalCluster, namespace: str, claim: str) -> None:
    """A bound, read-only PersistentVolumeClaim named ``claim`` (a shipped sample's model
    source): a PersistentVolume made for it and pre-bound, so the scheduler places the
    engine pods that mount it (KWOK mounts nothing)."""
    volume = f"{namespace}-{claim}"
    common = {"accessModes": ["ReadOnlyMany"], "storageClassName": "dsv4-e2e-models"}
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": volume},
        "spec": {
            **common,
            "capacity": {"storage": "1Gi"},
            "hostPath": {"path": f"/models/{volume}"},
            "claimRef": {"namespace": namespace, "name": claim},
        },
    }
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": namespace},
        "spec": {**common, "volumeName": volume, "resources": {"requests": {"storage": "1Gi"}}},
    }
    for obj in (pv, pvc):
        cluster.kubectl("apply", "-f", "-", input=json.dumps(obj))
    wait_for(
        f"PersistentVolumeClaim {namespace}/{claim} bound",
        lambda: get_json(cluster, "pvc", claim, "-n", namespace)["status"].get("phase") == "Bound",
        60,
    )


def kustomize(cluster: LocalCluster, folder: Path) -> list[dict[str, Any]]:
    out = cluster.kubectl("kustomize", str(folder)).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def as_list(objects: list[dict[str, Any]]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})


def responses(cluster: LocalCluster, offset: int) -> list[dict[str, Any]]:
    """Audit events after byte ``offset`` with the status the request got.  A watch is
    logged when its response starts; it completes only when it ends."""
    return [
        e
        for e in audit_events(cluster, offset)
        if e.get("stage") in ("ResponseStarted", "ResponseComplete")
    ]


MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
OPERATOR_NS = "dsv4-system"
OPERATOR_SA = f"system:serviceaccount:{OPERATOR_NS}:dsv4-operator"
OPERATOR_POD = "app.kubernetes.io/name=dsv4-operator"
SETTINGS = "dsv4-operator-settings"  # what the operator and its fence allow (fence.yaml)
# The container `installed_operator(image=...)` runs (one at a time per test process).
IMAGE_OPERATOR_NAME = f"dsv4-operator-e2e-{os.getpid()}"


def deployed_args(installed: list[dict[str, Any]]) -> list[str]:
    """The operator's arguments exactly as the installed Deployment runs them."""
    deployment = next(o for o in installed if o["kind"] == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container["args"]


def deployed_env(installed: list[dict[str, Any]]) -> dict[str, str]:
    """The environment the installed Deployment's pod gets from ConfigMaps it installs (the
    allowed model host paths, from the admission fence's settings)."""
    deployment = next(o for o in installed if o["kind"] == "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    maps = {
        o["metadata"]["name"]: o.get("data") or {} for o in installed if o["kind"] == "ConfigMap"
    }
    return {
        e["name"]: maps[ref["name"]][ref["key"]]
        for e in container.get("env", [])
        if (ref := e.get("valueFrom", {}).get("configMapKeyRef"))
    }


def with_port(args: list[str], port: int) -> list[str]:
    at = args.index("--health-port")
    return [*args[: at + 1], str(port), *args[at + 2 :]]


@dataclass
class Installed:
    proc: subprocess.Popen
    log: Path
    offset: int  # of the audit log when the operator started
    kubeconfig: Path  # the operator's ServiceAccount token, alone
    objects: list[dict[str, Any]]  # what the overlay installed


@contextlib.contextmanager
def installed_operator(
    cluster: LocalCluster,
    overlay: Path,
    workdir: Path,
    image: str | None = None,
    settings: dict[str, str] | None = None,
) -> Iterator[Installed]:
    """Installs ``overlay`` for real and runs the image's `dsv4-operator` with the installed
    Deployment's arguments and nothing but its ServiceAccount's token.  The operator stands
    in for the Deployment's pod (KWOK runs nothing): it gets that pod's name, as the
    downward API gives it, and so finds its probe image the same way.  It runs as a local
    process, or with ``image`` from that image (podman), under the installed Deployment's
    user, read-only root filesystem, /tmp emptyDir and capabilities.  ``settings`` change
    keys of the settings ConfigMap (fence.yaml) before the install, as a platform team's
    kustomize patch would."""
    objects = kustomize(cluster, overlay)
    for obj in objects:
        if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == SETTINGS:
            obj["data"] = {**obj.get("data", {}), **(settings or {})}
    cluster.kubectl(
        "apply", "--server-side", "--force-conflicts", "-f", "-", input=as_list(objects)
    )
    kubeconfig = account_kubeconfig(
        cluster, OPERATOR_NS, "dsv4-operator", workdir / "sa-kubeconfig.yaml"
    )
    (pod,) = wait_for(
        "the operator Deployment's pod",
        lambda: [
            p
            for p in get_json(cluster, "pods", "-n", OPERATOR_NS, "-l", OPERATOR_POD)["items"]
            if not p["metadata"].get("deletionTimestamp")
        ],
        60,
    )
    log = workdir / "operator.log"
    offset = cluster.audit_log.stat().st_size
    args = [*with_port(deployed_args(objects), free_port()), "--resync-seconds", "5"]
    env = {
        **deployed_env(objects),
        "POD_NAMESPACE": OPERATOR_NS,
        "POD_NAME": pod["metadata"]["name"],
    }
    if image is None:
        command = [str(Path(sys.executable).with_name("dsv4-operator")), *args]
        env = {**cluster.env, **env, "KUBECONFIG": str(kubeconfig)}
    else:
        command = from_image(objects, image, kubeconfig, env, args)
        env = {**os.environ, "CONTAINERS_CONF": str(images.CONTAINERS_CONF)}
    with log.open("w") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield Installed(proc, log, offset, kubeconfig, objects)
    finally:
        proc.send_signal(signal.SIGTERM)  # podman run passes it on to the container
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def from_image(
    objects: list[dict[str, Any]],
    image: str,
    kubeconfig: Path,
    env: dict[str, str],
    args: list[str],
) -> list[str]:
    """`podman run` of the installed Deployment's operator container from ``image``: its
    settings, ``env``, and ``kubeconfig`` (self-contained) made its user's, as a mounted
    token would be."""
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    pod_spec = deployment["spec"]["template"]["spec"]
    os.chown(kubeconfig, images.run_as_user(pod_spec, OPERATOR_CONTAINER), -1)
    return images.run_as_pod(
        pod_spec, OPERATOR_CONTAINER, image, IMAGE_OPERATOR_NAME, kubeconfig, args, env
    )


def as_account(
    kubeconfig: Path,
    *args: str,
    input: str | None = None,  # noqa: A002 - as subprocess.run
) -> subprocess.CompletedProcess[str]:
    """kubectl with only ``kubeconfig``'s credential (never the admin's)."""
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    return subprocess.run(
        [str(kubectl()), "--kubeconfig", str(kubeconfig), *args],
        capture_output=True, text=True, input=input, timeout=60, check=False, env=env,
    )  # fmt: skip


class Sampler(abc.ABC):
    """Samples the cluster in a thread of its own, every ``interval`` s from `start` until
    `stop`, with the API client of the cluster's kubeconfig (`sample` says what is read)."""

    def __init__(self, cluster: LocalCluster, interval: float) -> None:
        from kubernetes import config as kube_config

        from dsv4_operator.kube.client import Kube

        self._kube = Kube(kube_config.new_client_from_config(config_file=cluster.kubeconfig))
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    @abc.abstractmethod
    def sample(self) -> None:
        """One look at the cluster."""

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self._interval):
                return


class EngineCounterWatch(Sampler):
    """Samples one counter on every engine pod of ``namespace`` the local runtime serves
    (each pod's own `/metrics`, as a Prometheus scrape reaches it), every second until
    stopped, keeping each pod's highest value: pods retired mid-promotion are seen while
    they live."""

    def __init__(self, cluster: LocalCluster, namespace: str, counter: str) -> None:
        from dsv4_dev.localrun import endpoints

        super().__init__(cluster, interval=1.0)
        self._map = (endpoints.NAMESPACE, endpoints.NAME)
        self._pod_prefix, self._pod_suffix = "_pod.", f".{namespace}"
        self._line = re.compile(rf"^{re.escape(counter)}(?:{{[^}}]*}})? (\S+)$", re.M)
        self.highest: dict[str, float] = {}

    def sample(self) -> None:
        published = (self._kube.get("ConfigMap", *self._map) or {}).get("data") or {}
        for key, url in published.items():
            if not (key.startswith(self._pod_prefix) and key.endswith(self._pod_suffix)):
                continue
            pod = key[len(self._pod_prefix) : -len(self._pod_suffix)]
            try:
                with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
                    text = response.read().decode()
            except OSError:
                continue  # a pod stopping between the map and the scrape
            values = [float(v) for v in self._line.findall(text)]
            self.highest[pod] = max([self.highest.get(pod, 0.0), *values])


class ServingPairs(Sampler):
    """Samples, every ``interval`` s until stopped, how many slots of deployment ``name``
    could serve a request: a router pod and at least one prefill and one decode pod of its
    slot, each Ready and not terminating (the local runtime marks a pod Ready only once its
    process answers, and a terminating pod has left its Service's endpoints).  What a
    promotion that took a role to zero would show as a sample of 0."""

    def __init__(
        self, cluster: LocalCluster, namespace: str, name: str, interval: float = 0.5
    ) -> None:
        from dsv4_operator.render.meta import LABEL_INSTANCE

        super().__init__(cluster, interval)
        self._where = (namespace, f"{LABEL_INSTANCE}={name}")
        self.samples: list[int] = []

    @property
    def fewest(self) -> int:
        return min(self.samples)

    def sample(self) -> None:
        from dsv4_operator.render.meta import LABEL_COMPONENT, LABEL_SLOT

        serving: dict[str, set[str]] = {}  # slot → components serving
        for pod in self._kube.list("Pod", *self._where):
            meta = pod["metadata"]
            conditions = (pod.get("status") or {}).get("conditions") or []
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
            if ready and not meta.get("deletionTimestamp"):
                labels = meta.get("labels") or {}
                found = serving.setdefault(labels.get(LABEL_SLOT, ""), set())
                found.add(labels.get(LABEL_COMPONENT, ""))
        self.samples.append(sum({"router", "prefill", "decode"} <= f for f in serving.values()))
