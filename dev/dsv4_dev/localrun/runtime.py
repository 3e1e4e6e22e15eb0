"""The local embedded runtime: plays kubelet for DSV4 engine, router and probe pods on KWOK nodes.

KWOK marks pods Running without running anything.  This runtime watches DSV4 pods and, for
each, starts what the pod would run — the CPU reference engine with the pod's own
rendered `engine.yaml` (its role, its feature flags, fault injection included), or the
router pod's own container: sglang-router with the command and arguments the operator
rendered, discovering its engines by label through the API server as the router's
ServiceAccount — bound to the pod's own IP (a loopback address this runtime picks and
KWOK reports as the pod's: `dsv4_dev.cluster.pod_network`) and the ports the operator
rendered, then publishes each Service's address in the endpoint map (see `endpoints`).  A
pod that goes away takes its process with it.  A pod is scheduled, and so Ready, only once
its process answers (see `readiness`).  A canary's
probe Job pod runs its `dsv4ctl probe` command here too (from the venv, or from the local
image `$DSV4_LOCALRUN_IMAGES` maps its image to), and its exit goes to the API server, so
the Job controller completes or fails the Job (see `probes`).

An engine pod whose image `$DSV4_LOCALRUN_IMAGES` maps to a local build (the CPU engine
image `make images` builds) runs that image with podman instead: the pod's command, user,
security context and environment, its engine.yaml (made local, as below) where its
ConfigMap volume would put it.

Engines, routers and probes run from the venv are forked from one fork server that
imported the engine and the CLIs once (`forks`): the same entry point, arguments,
environment and log as a fresh process, without each importing torch again.

Only what cannot run here is changed: parallelism 1, and the address each process binds
(the pod's IP, where a pod's network namespace would bind every interface).  Everything
the canary is meant to catch (flags, HiCache, index-K dtype, the router and its discovery)
is exactly what the operator rendered.  The engine is never swapped: a pod of a deployment that runs SGLang (it needs
GPUs) is left alone, with one log line saying so — such a deployment says `engine: reference`
to run here (manifests/samples/flash-reference.yaml does).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import socket
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dsv4_dev import images
from dsv4_dev.cluster import pod_network
from dsv4_dev.localrun import accounts, endpoints, processes, readiness
from dsv4_dev.localrun.probes import IMAGES_ENV, ProbePods, parse_image_map, serialized
from dsv4_engine.commands import launch
from dsv4_engine.engine_config import Backend, EngineConfig, load_engine_yaml
from dsv4_operator.render.engine import ENGINE_PORT, short_hash
from dsv4_operator.render.meta import (
    ANNOTATION_CONFIG_HASH,
    APP,
    ENGINE_CONTAINER,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_NAME,
    PROBE_COMPONENT,
    Owner,
)
from dsv4_operator.render.router import ROUTER_PORT, router_name

# The rendered router command's interpreter (`render.router`): this venv's here.
ROUTER_PYTHON = "python3"

log = logging.getLogger("dsv4_dev.localrun")
READY_TIMEOUT_S = 60.0
# Logged once new DSV4 pods wait for this runtime (`readiness`): who starts it waits for it.
READY = "local runtime watching DSV4 pods"
# A terminating pod's process keeps running this long after it stopped being published and
# routed to (its container's preStop sleep when it has one), then gets SIGTERM and finishes
# what it has in flight — as a Service drops a terminating pod's endpoint before the pod
# stops; the pod is gone only once its process has (`readiness.HOLD`).
DRAIN_S = 3.0
# kubelet's readiness defaults: a pod leaves its Service after this many failed probes in a
# row, not after one slow answer on a busy machine (and joins it on its first good one).
FAILURE_THRESHOLD = 3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Process:
    pod_uid: str
    pod: str
    namespace: str
    instance: str  # the slice: `<name>` or `<name>--canary`
    component: str  # prefill | decode | router
    ip: str  # the pod's
    url: str
    popen: processes.Started
    command: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    bootstrap_port: int | None = None
    log_path: Path | None = None
    restarts: int = 0
    labels: dict[str, str] = field(default_factory=dict)  # the pod's
    service: str = ""  # the Service that publishes it
    ready_path: str = "/health"  # its container's readinessProbe, as kubelet asks it
    # Readiness as kubelet keeps it: not ready until it first answers, then ready until
    # FAILURE_THRESHOLD health checks in a row fail or the process exits.
    ready: bool = False
    failures: int = 0
    container_name: str | None = None  # podman's, when it runs from a local image
    drain_s: float = DRAIN_S  # from its pod's deletion to its SIGTERM

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


class NotReference(ValueError):
    """The pod runs an engine this machine cannot run (SGLang needs GPUs)."""


def check_reference(config: EngineConfig) -> None:
    """Refuse (NotReference) an engine this machine cannot run."""
    if config.backend is not Backend.REFERENCE:
        raise NotReference(
            f"it runs engine {config.backend.value}, which needs GPUs; the local runtime runs "
            "only `spec.engine: reference` (see manifests/samples/flash-reference.yaml)"
        )


def local_engine_yaml(text: str, ip: str) -> tuple[str, dict[str, str]]:
    """The pod's engine.yaml as the CPU reference engine runs it on the pod's ``ip``, plus
    the environment."""
    config = load_engine_yaml(text)
    check_reference(config)
    local = config.model_copy(
        update={
            "tp": 1,
            "dp": 1,
            "ep": 1,
            "enable_dp_attention": False,
            "multinode": None,
            "host": ip,
            "extra_args": (),
        }
    )
    return yaml.safe_dump(
        local.model_dump(mode="json", by_alias=True), sort_keys=True
    ), launch.fault_env(config)


def router_command(command: list[str], args: list[str], ip: str) -> list[str]:
    """A router pod's container as it runs here: its command and arguments, with this
    venv's interpreter for ``python3`` and every address it binds (``--host``, and
    ``--prometheus-host`` for its metrics port) the pod's ``ip``, not all interfaces."""
    argv = [sys.executable if command[:1] == [ROUTER_PYTHON] else command[0], *command[1:]]
    out = list(args)
    for flag in ("--host", "--prometheus-host"):
        if flag in out:
            out[out.index(flag) + 1] = ip
        else:
            out += [flag, ip]
    return argv + out


class PodAddresses:
    """The IPs this runtime gives the pods it runs (`pod_network.runtime_range`)."""

    def __init__(self, network: str) -> None:
        self.network = ipaddress.ip_network(network)

    def pick(self, taken: set[str]) -> str:
        for host in self.network.hosts():
            if str(host) not in taken:
                return str(host)
        raise RuntimeError(f"every address of {self.network} is taken")


@dataclass
class LocalRuntime:
    core: Any  # kubernetes.client.CoreV1Api
    workdir: Path
    custom: Any = None  # kubernetes.client.CustomObjectsApi: the readiness gate's policy
    # The IPs to give pods (None: only pods KWOK already gave an IP can run), and where the
    # cluster is (a router's identity: its ServiceAccount's token in a kubeconfig of its own).
    addresses: PodAddresses | None = None
    kubeconfig: Path | None = None
    extra_engine_args: dict[str, str] = field(default_factory=dict)
    # Pod image -> local image: engine pods of these images run from them (podman).
    images: dict[str, str] = field(default_factory=dict)
    processes: dict[str, Process] = field(default_factory=dict)
    # Health answers of this pass, by pod uid: the router, the endpoint map and the restart
    # checks all ask, and each answer is an HTTP round trip (up to 2 s on a busy machine).
    _health: dict[str, bool] = field(default_factory=dict, init=False, repr=False)
    # Pods this runtime will not run (another engine), told once each.
    _refused: set[str] = field(default_factory=set, init=False, repr=False)
    # Pods placed before this runtime ran, deleted for their controllers to make anew.
    _replaced: set[str] = field(default_factory=set, init=False, repr=False)
    # Probe Job pods' processes (None: probe pods are left to KWOK, as in unit tests).
    probes: ProbePods | None = None
    # Processes of vanished pods, unpublished and unrouted, stopped at their deadline.
    _draining: list[tuple[float, Process]] = field(default_factory=list, init=False, repr=False)
    # Pod IPs given out (annotated on listed pods) as of this pass.
    _taken: set[str] = field(default_factory=set, init=False, repr=False)

    def sync(self) -> None:
        """One pass: start what new Running pods need, stop what vanished pods left."""
        self._health.clear()
        pods = self.core.list_pod_for_all_namespaces(label_selector=f"{LABEL_NAME}={APP}").items
        live = {p.metadata.uid: p for p in pods if _live(p)}
        for uid in list(self.processes):
            if uid not in live:
                process = self.processes.pop(uid)
                self._draining.append((time.monotonic() + process.drain_s, process))
            elif self.processes[uid].popen.poll() is not None:
                self._restart(self.processes[uid])  # like kubelet: same pod, same port
        self._taken = {_annotated_ip(p) for p in pods} - {None}  # type: ignore[assignment]
        draining = {process.pod_uid for _, process in self._draining}
        for pod in pods:
            if pod.metadata.deletion_timestamp and readiness.held(pod):
                if pod.metadata.uid not in draining:  # no process of it here to wait out
                    self._let_go(pod.metadata.namespace, pod.metadata.name, pod.metadata.uid)
        for pod in live.values():
            if pod.metadata.uid in self.processes:
                continue
            readiness.hold(self.core, pod)  # one let go by a runtime that ran before this one
            if _component(pod) == "router":
                self._start_router(pod)
            else:
                self._start_engine(pod)
        published = self._publish()
        if self.probes is not None:
            self.probes.sync([p for p in pods if _component(p) == PROBE_COMPONENT], published)
        for pod in live.values():
            uid = pod.metadata.uid
            answers = uid in self.processes and self._healthy(self.processes[uid])
            if readiness.gated(pod) and (answers or uid in self._refused):
                readiness.lift(self.core, pod)
        now = time.monotonic()
        for deadline, process in [d for d in self._draining if d[0] <= now]:
            self._draining.remove((deadline, process))
            self._stop(process)

    def stop_all(self) -> None:
        for process in [*self.processes.values(), *(p for _, p in self._draining)]:
            self._stop(process)
        self.processes.clear()
        self._draining.clear()
        if self.probes is not None:
            self.probes.stop_all()
        self._publish()
        self._release()

    def _release(self) -> None:
        """Leave the pods to KWOK: no more gates for new pods, none left on waiting ones (a
        pod that ended, a probe pod this runtime ran, stays where it ended)."""
        if self.custom is not None:
            readiness.uninstall(self.custom)
        pods = self.core.list_pod_for_all_namespaces(label_selector=f"{LABEL_NAME}={APP}").items
        for pod in pods:
            if readiness.gated(pod) and pod.status.phase not in ("Succeeded", "Failed"):
                readiness.lift(self.core, pod)
            if readiness.held(pod):
                self._let_go(pod.metadata.namespace, pod.metadata.name, pod.metadata.uid)

    # -- engines -------------------------------------------------------------------------
    def _start_engine(self, pod: Any) -> None:
        ns, role = pod.metadata.namespace, _component(pod)
        config = next(
            (v.config_map.name for v in pod.spec.volumes or [] if v.config_map is not None),
            None,
        )
        if config is None:
            return
        data = self.core.read_namespaced_config_map(config, ns).data or {}
        text = data.get(f"{role}.yaml")
        wanted = (pod.metadata.annotations or {}).get(ANNOTATION_CONFIG_HASH)
        if text is None or short_hash(text) != wanted:
            return  # the ConfigMap for this pod's template is not there yet: next pass
        try:
            check_reference(load_engine_yaml(text))
        except NotReference as why:
            if pod.metadata.uid not in self._refused:
                self._refused.add(pod.metadata.uid)
                log.warning("not running pod %s/%s: %s", ns, pod.metadata.name, why)
            return
        ip = self._pod_ip(pod)
        if ip is None:
            return
        local, env = local_engine_yaml(text, ip)
        engine_config = load_engine_yaml(local)
        stem = f"{pod.metadata.name}-{pod.metadata.uid[:8]}"
        spec = serialized(pod.spec)
        engine = [c["image"] for c in spec["containers"] if c["name"] == ENGINE_CONTAINER]
        image = self.images.get(engine[0]) if engine else None
        bootstrap = engine_config.disaggregation.bootstrap_port
        if image is None:
            # What the image's `dsv4-engine launch` would exec for this engine.yaml, in the
            # environment the pod's engine container sets.
            command, env = launch.command(engine_config)
            own = {
                e["name"]: e["value"]
                for c in spec["containers"]
                if c["name"] == ENGINE_CONTAINER
                for e in c.get("env", [])
                if "value" in e
            }
            self._spawn(pod, command, {**own, **env}, ip, engine_config.port, bootstrap)
            return
        # The pod's container from the image: its command, user and security context, its
        # engine.yaml (made local) where its ConfigMap volume puts it.
        name = f"dsv4-{role}-{pod.metadata.uid}"
        volumes = images.host_volumes(
            spec, ENGINE_CONTAINER, self.workdir / stem, {f"{role}.yaml": local}
        )
        command = images.podman_run(
            spec,
            ENGINE_CONTAINER,
            image,
            name,
            *volumes,
            *(f"--env={k}={v}" for k, v in env.items()),
        )
        environment = {"CONTAINERS_CONF": str(images.CONTAINERS_CONF)}
        self._spawn(pod, command, environment, ip, engine_config.port, bootstrap)
        self.processes[pod.metadata.uid].container_name = name

    def _start_router(self, pod: Any) -> None:
        """The router pod's container: sglang-router as rendered, on the pod's IP, as the
        pod's ServiceAccount (its discovery lists and watches pods through the API server)."""
        container = pod.spec.containers[0]
        if not container.command or self.kubeconfig is None:
            return
        ip = self._pod_ip(pod)
        if ip is None:
            return
        account = pod.spec.service_account_name
        token = accounts.request_token(
            self.core, pod.metadata.namespace, account, (pod.metadata.name, pod.metadata.uid)
        )
        path = self.workdir / f"{pod.metadata.name}-{pod.metadata.uid[:8]}.kubeconfig"
        accounts.write_kubeconfig(path, accounts.token_kubeconfig(self.kubeconfig, account, token))
        command = router_command(list(container.command), list(container.args or []), ip)
        port = int(command[command.index("--port") + 1]) if "--port" in command else ROUTER_PORT
        self._spawn(pod, command, {"KUBECONFIG": str(path)}, ip, port, None)

    def _pod_ip(self, pod: Any) -> str | None:
        """The pod's IP: the one this runtime gave it, else (a pod still waiting at the
        gate) a free one, now written into the pod.  A pod KWOK placed before this runtime
        played kubelet has an IP of KWOK's, where nothing here can listen: it is deleted,
        for its controller to make it anew, at the gate.  None: nothing to bind yet (try
        next pass)."""
        from kubernetes.client import ApiException

        given = _annotated_ip(pod)
        if given is not None:
            return given
        if self.addresses is None:
            return pod.status.pod_ip or None
        if not readiness.gated(pod):
            self._replace(pod)
            return None

        taken = self._taken | {p.ip for p in self.processes.values()}
        taken |= {p.ip for _, p in self._draining}
        ip = self.addresses.pick(taken)
        patch = {"metadata": {"annotations": {pod_network.POD_IP_ANNOTATION: ip}}}
        try:
            self.core.patch_namespaced_pod(pod.metadata.name, pod.metadata.namespace, patch)
        except ApiException as err:
            if err.status in (404, 409):
                return None
            raise
        self._taken.add(ip)
        return ip

    def _spawn(
        self,
        pod: Any,
        command: list[str],
        env: dict[str, str],
        ip: str,
        port: int,
        bootstrap: int | None,
    ) -> None:
        self._reclaim(ip)
        log_path = self.workdir / f"{pod.metadata.name}-{pod.metadata.uid[:8]}.log"
        probe = next((c.readiness_probe for c in pod.spec.containers if c.readiness_probe), None)
        http = getattr(probe, "http_get", None)
        popen = processes.popen(command, env, log_path)
        process = Process(
            pod_uid=pod.metadata.uid,
            pod=pod.metadata.name,
            namespace=pod.metadata.namespace,
            instance=_instance(pod),
            component=_component(pod),
            ip=ip,
            url=f"http://{ip}:{port}",
            popen=popen,
            command=tuple(command),
            env=env,
            bootstrap_port=bootstrap,
            log_path=log_path,
            labels=dict(pod.metadata.labels or {}),
            service=pod.spec.subdomain or "",
            ready_path=getattr(http, "path", None) or "/health",
            drain_s=_pre_stop_s(pod) or DRAIN_S,
        )
        self.processes[pod.metadata.uid] = process
        log.info(
            "started %s for pod %s/%s on %s%s",
            process.component,
            process.namespace,
            pod.metadata.name,
            process.url,
            f" with {env}" if env else "",
        )

    def _replace(self, pod: Any) -> None:
        """Delete a pod placed before this runtime played kubelet (once; its controller makes
        it anew, and the new one waits at the gate for an IP of this runtime's)."""
        from kubernetes.client import ApiException

        if pod.metadata.uid in self._replaced:
            return
        self._replaced.add(pod.metadata.uid)
        log.warning(
            "pod %s/%s was placed before the local runtime ran (its IP %s is KWOK's, where "
            "nothing here can listen): deleting it for its controller to make it anew",
            pod.metadata.namespace, pod.metadata.name, pod.status.pod_ip,
        )  # fmt: skip
        try:
            self.core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace)
        except ApiException as err:
            if err.status != 404:
                raise

    def _reclaim(self, ip: str) -> None:
        """Stop now a draining process on ``ip``: KWOK gives a pod's IP out again as soon as
        the pod is gone, and on one machine the new pod's process could not bind it while
        the old one still does (each pod's network namespace is its own on a node)."""
        for deadline, process in [d for d in self._draining if d[1].ip == ip]:
            self._draining.remove((deadline, process))
            self._stop(process)

    def _restart(self, process: Process) -> None:
        assert process.log_path is not None
        code = process.popen.returncode
        process.restarts += 1
        process.ready, process.failures = False, 0
        process.popen = processes.popen(list(process.command), process.env, process.log_path)
        log.warning(
            "%s of %s/%s exited (%s); restarted (%d restarts), log %s",
            process.component,
            process.namespace,
            process.instance,
            code,
            process.restarts,
            process.log_path,
        )

    def _healthy(self, process: Process) -> bool:
        """Whether ``process`` is ready, probing it at most once a pass."""
        if process.popen.poll() is not None:
            process.ready = False
            return False
        if process.pod_uid not in self._health:
            if _answers(process.url + process.ready_path):
                process.ready, process.failures = True, 0
            else:
                process.failures += 1
                if process.failures >= FAILURE_THRESHOLD:
                    process.ready = False
            self._health[process.pod_uid] = process.ready
        return self._health[process.pod_uid]

    def _stop(self, process: Process) -> None:
        processes.terminate(process.popen, process.container_name)
        log.info("stopped %s of %s/%s", process.component, process.namespace, process.instance)
        self._let_go(process.namespace, process.pod, process.pod_uid)

    def _let_go(self, namespace: str, pod: str, uid: str) -> None:
        """The pod's container has stopped, so the pod may go: at once when it is marked for
        deletion (KWOK deletes it), else whenever it is."""
        readiness.let_go(self.core, namespace, pod, uid)

    def _endpoint_map(self) -> dict[str, str]:
        """Service → loopback URL for every ready process (the first of each Service), and
        each engine pod's own."""
        data: dict[str, str] = {}
        for p in self.processes.values():
            if not self._healthy(p):
                continue
            owner = Owner(name=p.instance, namespace=p.namespace, uid="")
            if p.component == "router":
                # One Service fronts every slot's routers: any ready one answers for it.
                data.setdefault(endpoints.key(router_name(owner), p.namespace, ROUTER_PORT), p.url)
            else:
                data[endpoints.pod_key(p.pod, p.namespace)] = p.url
                if p.service:
                    data.setdefault(endpoints.key(p.service, p.namespace, ENGINE_PORT), p.url)
        return data

    def _publish(self) -> dict[str, str]:
        """Publish the endpoint map (written only when it changed); returns it."""
        data = self._endpoint_map()
        current = _read_or_none(self.core, endpoints.NAME, endpoints.NAMESPACE)
        before = (current.data or {}) if current is not None else {}
        for gone in sorted(before.keys() - data.keys()):
            log.info("%s no longer has a ready local endpoint", endpoints.label(gone))
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": endpoints.NAME, "namespace": endpoints.NAMESPACE},
            "data": data,
        }
        if current is None:
            self.core.create_namespaced_config_map(endpoints.NAMESPACE, body)
        elif before != data:
            self.core.replace_namespaced_config_map(endpoints.NAME, endpoints.NAMESPACE, body)
        return data

    def run_forever(self, interval: float = 1.0) -> None:
        processes.FORKS.start()  # the engine's imports, while the gate is set up
        if self.custom is not None:
            readiness.install(self.custom)
            readiness.wait_effective(self.core, endpoints.NAMESPACE)
        log.info("%s; logs in %s", READY, self.workdir)
        try:
            while True:
                try:
                    self.sync()
                except Exception as err:  # noqa: BLE001 - a playing kubelet keeps playing
                    log.warning("local runtime pass failed: %s", err)
                time.sleep(interval)
        finally:
            self.stop_all()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _read_or_none(core: Any, name: str, namespace: str) -> Any:
    from kubernetes.client import ApiException

    try:
        return core.read_namespaced_config_map(name, namespace)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def _live(pod: Any) -> bool:
    """A pod whose process should run: Running, or waiting at this runtime's gate for it."""
    return (
        (pod.status.phase == "Running" or readiness.gated(pod))
        and pod.metadata.deletion_timestamp is None
        and _component(pod) in ("prefill", "decode", "router")
    )


def _pre_stop_s(pod: Any) -> float | None:
    """The seconds of the first container's preStop sleep, if it has one."""
    hook = pod.spec.containers[0].lifecycle
    sleep = getattr(getattr(hook, "pre_stop", None), "sleep", None)
    return float(sleep.seconds) if sleep is not None else None


def _annotated_ip(pod: Any) -> str | None:
    return (pod.metadata.annotations or {}).get(pod_network.POD_IP_ANNOTATION)


def _component(pod: Any) -> str:
    return (pod.metadata.labels or {}).get(LABEL_COMPONENT, "")


def _instance(pod: Any) -> str:
    return (pod.metadata.labels or {}).get(LABEL_INSTANCE, "")


def main() -> int:
    """`python -m dsv4_dev.localrun.runtime`: run against $KUBECONFIG until stopped."""
    from kubernetes import client, config
    from kubernetes.config.kube_config import KUBE_CONFIG_DEFAULT_LOCATION

    try:
        image_map = parse_image_map(os.environ.get(IMAGES_ENV, ""))
    except ValueError as err:
        raise SystemExit(f"local runtime: {err}") from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s localrun %(message)s")
    config.load_kube_config()
    kubeconfig = Path(KUBE_CONFIG_DEFAULT_LOCATION.split(os.pathsep)[0]).expanduser()
    workdir = Path(os.environ.get("DSV4_LOCALRUN_DIR", "/tmp/dsv4-localrun"))
    workdir.mkdir(parents=True, exist_ok=True)
    core = client.CoreV1Api()
    namespace, name = pod_network.PUBLISHED
    try:
        published = core.read_namespaced_config_map(name, namespace).data[pod_network.RANGE_KEY]
    except (client.ApiException, KeyError, TypeError):
        raise SystemExit(
            f"local runtime: the cluster publishes no pod network (ConfigMap {namespace}/{name}): "
            "it was made by an older dsv4ctl; recreate it (dsv4ctl cluster down, then up)"
        ) from None
    runtime = LocalRuntime(
        core,
        workdir,
        custom=client.CustomObjectsApi(),
        addresses=PodAddresses(published),
        kubeconfig=kubeconfig,
        images=image_map,
        probes=ProbePods(core, workdir, kubeconfig, images=image_map),
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    runtime.run_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
