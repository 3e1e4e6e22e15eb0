"""Probe Job pods, played by the local runtime: their command runs here, and their exit is
reported to the API server, so the real Job controller completes, fails or retries the Job.

KWOK's default pod stages (v0.8.0, `kustomize/stage/pod/fast`) complete every Job-owned
pod the moment it runs: `pod-complete` sets phase Succeeded and exit code 0 without running
anything, so on a fake node a probe Job "succeeds" without having probed.  So while a
runtime plays kubelet, a probe pod waits at the runtime's scheduling gate (`readiness`)
for its whole life: never bound to a fake node, KWOK never touches it (every other Job's
pods keep KWOK's behaviour).  Meanwhile the runtime runs the pod's one container:

* its command and arguments as the Job renders them, from this venv (the venv holds what
  the operator image installs, `dsv4ctl` included) — or, when the runtime is given a local
  image for the pod's image (`$DSV4_LOCALRUN_IMAGES`, `pod image=local image,...`: the
  one `make images` built), from that image with podman, under the pod's own user,
  read-only root filesystem, emptyDirs and capabilities (`dsv4_dev.images.pod_run`), so
  the probe Job path runs what ships;
* as the pod's ServiceAccount: a token bound to the pod (`accounts`), in a kubeconfig of
  its own given as $KUBECONFIG (mounted read-only into a container, owned by its user), as
  a pod's mounted token is found without a flag;
* reaching cluster Services through the endpoint map: the one change to its arguments is
  that a Service URL (`http://<service>.<namespace>.svc:<port>`) becomes the loopback URL
  the map publishes for it, as the Service's DNS name would resolve to its cluster IP.

When the process exits the runtime reports it as kubelet does — phase Succeeded or Failed,
the container terminated with its exit code — once.  A pod that goes away meanwhile (its
Job stopped or past its deadline) takes its process with it.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from dsv4_dev import images
from dsv4_dev.localrun import accounts, endpoints, processes, readiness

log = logging.getLogger("dsv4_dev.localrun")
# A Service's cluster DNS name as the operator writes it into a probe Job (and the longer
# form a resolver accepts); neither a Service nor a namespace has a ".".
SERVICE_URL = re.compile(
    r"(?P<scheme>https?)://(?P<service>[a-z0-9-]+)\.(?P<namespace>[a-z0-9-]+)"
    r"\.svc(?:\.cluster\.local)?:(?P<port>\d+)(?P<path>/.*)?"
)
# The environment variable that maps pod images to local images (`parse_image_map`).
IMAGES_ENV = "DSV4_LOCALRUN_IMAGES"


def parse_image_map(text: str) -> dict[str, str]:
    """`$DSV4_LOCALRUN_IMAGES`: `pod image=local image` pairs, comma-separated (an image
    name has neither `=` nor `,`).  A malformed entry is refused naming it."""
    found = {}
    for entry in filter(None, (e.strip() for e in text.split(","))):
        pod_image, sep, local = entry.partition("=")
        if not sep or not pod_image or not local:
            raise ValueError(
                f"${IMAGES_ENV}: {entry!r} is not `pod image=local image` "
                "(e.g. ghcr.io/dsv4/operator:0.1.0=localhost/dsv4-operator:dev)"
            )
        found[pod_image] = local
    return found


def local_args(args: list[str], published: dict[str, str]) -> list[str]:
    """``args`` with every Service URL that has a published endpoint replaced by it; an
    unpublished Service's URL is left as it is (here its name resolves to nothing, as a
    Service without a ready endpoint answers nothing in a cluster)."""

    def local(arg: str) -> str:
        found = SERVICE_URL.fullmatch(arg)
        if found is None:
            return arg
        key = endpoints.key(found["service"], found["namespace"], int(found["port"]))
        url = published.get(key)
        return arg if url is None else url + (found["path"] or "")

    return [local(arg) for arg in args]


def exit_code(returncode: int) -> int:
    """The container exit code kubelet reports: 128 + the signal for a killed process."""
    return returncode if returncode >= 0 else 128 - returncode


def exit_status(
    container: str, image: str, code: int, started: str, finished: str, image_id: str = ""
) -> dict:
    """The pod status kubelet reports once its only container (restartPolicy Never) ended;
    ``image_id``: the image it ran, when it ran from one."""
    terminated = {
        "exitCode": code,
        "reason": "Completed" if code == 0 else "Error",
        "startedAt": started,
        "finishedAt": finished,
    }
    return {
        "status": {
            "phase": "Succeeded" if code == 0 else "Failed",
            "containerStatuses": [
                {
                    "name": container,
                    "image": image,
                    "imageID": image_id,
                    "ready": False,
                    "restartCount": 0,
                    "started": False,
                    "state": {"terminated": terminated},
                }
            ],
        }
    }


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ProbeRun:
    """One probe pod's process."""

    pod: str
    namespace: str
    container: str
    image: str
    popen: subprocess.Popen
    started: str
    image_id: str = ""  # the local image's, when it runs from one (as kubelet reports it)
    container_name: str | None = None  # podman's, when it runs from an image


@dataclass
class ProbePods:
    core: Any  # kubernetes.client.CoreV1Api
    workdir: Path
    kubeconfig: Path  # the runtime's own: where the cluster is (never whose credential)
    bin_dir: Path = field(default_factory=lambda: Path(sys.executable).parent)
    # Pod image -> local image: probe pods of these images run from them (podman).
    images: dict[str, str] = field(default_factory=dict)
    runs: dict[str, ProbeRun] = field(default_factory=dict)  # by pod uid
    # Pods whose exit was reported, until they leave the listing: a list taken just
    # before the report landed still shows them waiting, and a pod runs once.
    _reported: set[str] = field(default_factory=set, init=False, repr=False)

    def sync(self, pods: list[Any], published: dict[str, str]) -> None:
        """One pass over the probe pods (``pods``, all of them): report what exited, stop
        what lost its pod, start what waits for this runtime."""
        probes = {p.metadata.uid: p for p in pods}
        for uid, run in list(self.runs.items()):
            pod = probes.get(uid)
            if pod is None or pod.metadata.deletion_timestamp is not None:
                processes.terminate(run.popen, run.container_name)
                del self.runs[uid]
                log.info("stopped probe of %s/%s: its pod is gone", run.namespace, run.pod)
            elif run.popen.poll() is not None:
                self._report(uid, run)
        for uid, pod in probes.items():
            if uid not in self.runs and uid not in self._reported and _waiting(pod):
                self._start(pod, published)
        self._reported &= probes.keys()

    def stop_all(self) -> None:
        """Stop every probe and report how it ended (as when kubelet kills a container):
        the Job controller, not this runtime, decides what comes next."""
        for uid, run in list(self.runs.items()):
            processes.terminate(run.popen, run.container_name)
            self._report(uid, run)

    def _start(self, pod: Any, published: dict[str, str]) -> None:
        name, namespace = pod.metadata.name, pod.metadata.namespace
        containers = pod.spec.containers
        if len(containers) != 1 or not containers[0].command:
            log.warning(
                "not running probe pod %s/%s: not one container with a command", namespace, name
            )
            self._reported.add(pod.metadata.uid)
            return
        (container,) = containers
        args = local_args(list(container.args or []), published)
        token = accounts.request_token(
            self.core, namespace, pod.spec.service_account_name, (name, pod.metadata.uid)
        )
        stem = f"{name}-{pod.metadata.uid[:8]}"
        log_path = self.workdir / f"{stem}.log"
        identity = accounts.token_kubeconfig(self.kubeconfig, pod.spec.service_account_name, token)
        local_image = self.images.get(container.image)
        spec = None if local_image is None else serialized(pod.spec)
        kubeconfig = accounts.write_kubeconfig(
            self.workdir / f"{stem}.kubeconfig",
            identity,
            owner=None if spec is None else images.run_as_user(spec, container.name),
        )
        image_id, container_name = "", None
        if spec is None:
            executable = self.bin_dir / container.command[0]
            command = [
                str(executable) if executable.exists() else container.command[0],
                *container.command[1:],
                *args,
            ]
            env = {e.name: e.value for e in container.env or [] if e.value is not None}
            env["KUBECONFIG"] = str(kubeconfig)
        else:
            image_id, container_name = _image_id(local_image), f"dsv4-probe-{pod.metadata.uid}"
            command = images.run_as_pod(
                spec, container.name, local_image, container_name, kubeconfig, args
            )
            env = {"CONTAINERS_CONF": str(images.CONTAINERS_CONF)}
        self.runs[pod.metadata.uid] = ProbeRun(
            pod=name,
            namespace=namespace,
            container=container.name,
            image=container.image,
            popen=processes.popen(command, env, log_path),
            started=_now(),
            image_id=image_id,
            container_name=container_name,
        )
        log.info(
            "started probe for pod %s/%s as %s%s: %s; log %s",
            namespace,
            name,
            pod.spec.service_account_name,
            f" from image {local_image}" if local_image else "",
            " ".join(command),
            log_path,
        )

    def _report(self, uid: str, run: ProbeRun) -> None:
        """The exit, to the API server; a report that fails is tried again next pass."""
        from kubernetes.client import ApiException

        code = exit_code(run.popen.returncode)
        body = exit_status(run.container, run.image, code, run.started, _now(), run.image_id)
        try:
            self.core.patch_namespaced_pod_status(run.pod, run.namespace, body)
        except ApiException as err:
            if err.status != 404:  # a pod that is gone needs no report
                log.warning(
                    "probe pod %s/%s exit not reported yet: %s", run.namespace, run.pod, err
                )
                return
        del self.runs[uid]
        self._reported.add(uid)
        log.info("probe pod %s/%s exited %d: reported", run.namespace, run.pod, code)


def _image_id(image: str) -> str:
    """``image``'s id as kubelet reports a container's (`sha256:<hex>`)."""
    found = images.podman("image", "inspect", "--format", "{{.Id}}", image, check=True)
    return f"sha256:{found.stdout.strip()}"


def serialized(spec: Any) -> dict[str, Any]:
    """A pod spec of the Kubernetes client as its JSON (camelCase) dict, as the images'
    podman options read it."""
    from kubernetes.client import ApiClient

    return ApiClient().sanitize_for_serialization(spec)


def _waiting(pod: Any) -> bool:
    """Waiting at this runtime's gate for its process, not yet ended or deleted."""
    return (
        readiness.gated(pod)
        and pod.status.phase == "Pending"
        and pod.metadata.deletion_timestamp is None
    )
