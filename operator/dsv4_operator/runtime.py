"""`dsv4-operator run`: health endpoints, leader election, then the kopf operator.

Order matters: the health server answers first (liveness is true as soon as the process
runs; readiness only once this replica leads and kopf has started watching), then the
Lease is acquired, then kopf runs until leadership is lost or a signal arrives.

This is the operator the image runs: probes run as Jobs and Services are reached by their
cluster DNS names.  The development launcher (`dsv4_dev.operator`, not in the image) runs
the same `serve` with its own `Wiring`: the local runtime's endpoints, in-process probes,
crash injection and a debug endpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import kopf
from aiohttp import web
from kubernetes import client, config
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from dsv4_operator import leader, metrics
from dsv4_operator.api import CRD_NAME, GROUP, PLURAL, VERSION, allowed, host_paths
from dsv4_operator.api.allowed import Allowed
from dsv4_operator.kube.cache import Cache, Reader
from dsv4_operator.kube.client import ApiError, Kube
from dsv4_operator.reconcile import handlers, watches
from dsv4_operator.reconcile.controller import WORKERS, Controller
from dsv4_operator.reconcile.reconciler import Reconciler
from dsv4_operator.render.meta import Owner
from dsv4_operator.rollout.controller import (
    RolloutController,
    ServiceUrl,
    Serving,
    cluster_service_url,
)
from dsv4_operator.rollout.executor import ProbeExecutor
from dsv4_operator.rollout.job_executor import JobProbeExecutor

log = logging.getLogger("dsv4_operator.runtime")
USER_AGENT = "dsv4-operator"
OPERATOR_CONTAINER = "operator"  # manifests/base/deployment.yaml
_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and any `extra=` fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(
            {k: v for k, v in record.__dict__.items() if k not in _STANDARD and _jsonable(v)}
        )
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def _jsonable(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool, type(None), list, dict))


def build_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The command line and its `run` subcommand (the development launcher adds to it)."""
    parser = argparse.ArgumentParser(prog="dsv4-operator", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="Run the operator (leader-elected).")
    run.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        help="Watch only this namespace (repeatable); without it, every namespace.",
    )
    run.add_argument("--health-port", type=int, default=8080)
    run.add_argument(
        "--resync-seconds",
        type=float,
        default=60.0,
        help="Each deployment gets a pass at least this often (from the cache: no requests).",
    )
    run.add_argument(
        "--workers",
        type=int,
        default=WORKERS,
        help="Passes run at once (different deployments; one deployment never runs two).",
    )
    run.add_argument("--lease-name", default="dsv4-operator")
    run.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE", "default"))
    run.add_argument("--identity", default=f"{socket.gethostname()}-{os.getpid()}")
    run.add_argument("--lease-seconds", type=int, default=15)
    run.add_argument(
        host_paths.FLAG,
        dest="allowed_model_host_paths",
        type=_allow_list(host_paths.parse_prefixes),
        default=os.environ.get(host_paths.ENV, ""),
        metavar="PREFIX[,PREFIX...]",
        help="Host directories a DSV4Deployment may read its model from (spec.model.hostPath; "
        f"default: ${host_paths.ENV}, which the installed Deployment takes from the admission "
        "fence's ConfigMap dsv4-operator-settings); none by default: the recommended source "
        "is a read-only PVC.",
    )
    # The administrator's allow-lists (`api.allowed`): each flag's default is its settings
    # key, which the installed Deployment passes as an environment variable.
    for flag, dest, parse, env, shipped, metavar, what in (
        (
            allowed.IMAGES_FLAG, "allowed_images", allowed.parse_images, allowed.IMAGES_ENV,
            allowed.SHIPPED_IMAGES, "PREFIX[,PREFIX...]",
            "Registries, repositories or images a DSV4Deployment's pods may run "
            "(spec.image.name, spec.router.image",
        ),
        (
            allowed.TOLERATIONS_FLAG, "allowed_tolerations", allowed.parse_tolerations,
            allowed.TOLERATIONS_ENV, allowed.SHIPPED_TOLERATIONS, "KEY[=VALUE][:EFFECT][,...]",
            "Tolerations a DSV4Deployment's pods may carry, as the taints they tolerate "
            "(spec.placement.tolerations",
        ),
        (
            allowed.DEVICES_FLAG, "allowed_device_resources", allowed.parse_devices,
            allowed.DEVICES_ENV, allowed.SHIPPED_DEVICES, "RESOURCE[,RESOURCE...]",
            "Device resources an engine pod may request for its RDMA NICs "
            "(spec.<role>.resources.rdma.resourceName",
        ),
        (
            allowed.PRIORITY_CLASSES_FLAG, "allowed_priority_classes",
            allowed.parse_priority_classes, allowed.PRIORITY_CLASSES_ENV,
            allowed.SHIPPED_PRIORITY_CLASSES, "CLASS[,CLASS...]",
            "PriorityClasses the engine pods may run at (spec.placement.priorityClassName",
        ),
    ):  # fmt: skip
        run.add_argument(
            flag,
            dest=dest,
            type=_allow_list(parse),
            default=os.environ.get(env, shipped),
            metavar=metavar,
            help=f"{what}; default: ${env}, from the fence's ConfigMap "
            f"dsv4-operator-settings, else {shipped}).",
        )
    run.add_argument(
        "--probe-image",
        default=None,
        help="Image of the probe Jobs (default: this operator pod's own image, via $POD_NAME).",
    )
    run.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser, run


def _allow_list(parse: Callable[[str], tuple[str, ...]]) -> Callable[[str], tuple[str, ...]]:
    """An argparse type from an allow-list parser (`api.host_paths`, `api.allowed`): its
    ValueError becomes argparse's error."""

    def parsed(text: str) -> tuple[str, ...]:
        try:
            return parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    return parsed


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = build_parser()[0]
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers: at least 1 (got {args.workers})")
    if args.resync_seconds <= 0:
        parser.error(f"--resync-seconds: more than 0 (got {args.resync_seconds:g})")
    return args


def allowed_by(args: argparse.Namespace) -> Allowed:
    """What the administrator allows deployments, from the parsed `run` flags."""
    return Allowed(
        model_host_paths=args.allowed_model_host_paths,
        images=args.allowed_images,
        tolerations=args.allowed_tolerations,
        device_resources=args.allowed_device_resources,
        priority_classes=args.allowed_priority_classes,
    )


def probe_image(kube: Kube, explicit: str | None) -> str:
    """The image probe Jobs run: `--probe-image`, else the operator pod's own, so an image
    override of the operator's Deployment (kustomize `images:`) moves its probes too."""
    if explicit:
        return explicit
    pod_name, namespace = os.environ.get("POD_NAME"), os.environ.get("POD_NAMESPACE")
    if not pod_name or not namespace:
        raise SystemExit(
            "dsv4-operator: --probe-mode job needs the probe image: pass --probe-image, or "
            "run in a pod with POD_NAME and POD_NAMESPACE set (manifests/base does)"
        )
    try:
        pod = kube.get("Pod", namespace, pod_name)
    except ApiError as err:
        raise SystemExit(
            f"dsv4-operator: cannot read pod {namespace}/{pod_name} for the probe image "
            f"({err}); pass --probe-image"
        ) from None
    containers = (pod or {}).get("spec", {}).get("containers", [])
    images = [c["image"] for c in containers if c.get("name") == OPERATOR_CONTAINER]
    if not images:
        raise SystemExit(
            f"dsv4-operator: cannot find container {OPERATOR_CONTAINER!r} of pod "
            f"{namespace}/{pod_name} for the probe image; pass --probe-image"
        )
    return images[0]


def load_kube_config() -> None:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()


Route = tuple[str, Callable[[web.Request], Awaitable[web.Response]]]
# Called when a probe filed its verdict, with the DSV4Deployment it is about.
ProbeDone = Callable[[Owner], None]


@dataclass
class Wiring:
    """How this process probes canaries and reaches Services, and what more its health
    port serves.  `job_wiring` is the image's; a development launcher brings its own."""

    # Made once the cache exists: (who to tell of a filed verdict, where passes read).
    executor: Callable[[ProbeDone, Reader], ProbeExecutor]
    probe_url: ServiceUrl = cluster_service_url  # where the probes reach a Service
    serving: Serving | None = None  # whether a Service serves; None: its EndpointSlices
    routes: list[Route] = field(default_factory=list)


def job_wiring(kube: Kube, args: argparse.Namespace) -> Wiring:
    """Probes run as Jobs of the probe image, in the cluster, reaching Services by DNS."""
    image = probe_image(kube, args.probe_image)
    log.info("probes run as Jobs", extra={"probe_image": image})
    return Wiring(executor=lambda _, cache: JobProbeExecutor(kube, cache, image))


class StartupError(Exception):
    """The operator cannot start as configured; the message names the flag."""


class Health:
    def __init__(self, kube: Kube, leadership: leader.Leadership) -> None:
        self.kube = kube
        self.leadership = leadership
        self.watching = asyncio.Event()  # kopf watches the DSV4Deployments
        self.synced = asyncio.Event()  # the informers' caches are filled
        self.controller: Controller | None = None

    async def healthz(self, _: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def readyz(self, _: web.Request) -> web.Response:
        leading = self.leadership.held()
        watching, synced = self.watching.is_set(), self.synced.is_set()
        ready = leading and watching and synced
        body = {"leader": leading, "watching": watching, "synced": synced}
        return web.json_response(body, status=200 if ready else 503)

    async def passes(self, _: web.Request) -> web.Response:
        """The reconcile passes run so far and how long each took (for the benchmarks)."""
        return web.json_response(self.controller.stats() if self.controller else {})

    async def metrics(self, _: web.Request) -> web.Response:
        body = generate_latest(metrics.REGISTRY)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self, port: int, routes: Sequence[Route] = ()) -> web.AppRunner:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/debug/passes", self.passes)
        for path, handler in routes:
            app.router.add_get(path, handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "0.0.0.0", port).start()
        return runner


async def serve(
    args: argparse.Namespace,
    wire: Callable[[Kube, argparse.Namespace], Wiring] = job_wiring,
) -> int:
    load_kube_config()
    configuration = client.Configuration.get_default_copy()
    # One connection per informer's watch, and more for the passes' requests.
    configuration.connection_pool_maxsize = 64
    api = client.ApiClient(configuration)
    api.user_agent = USER_AGENT  # so the API server's audit log tells the operator's requests
    kube = Kube(api)
    wiring = await asyncio.to_thread(wire, kube, args)
    lease = leader.LeaseConfig.scaled(
        args.lease_name, args.lease_namespace, args.identity, args.lease_seconds
    )
    leadership = leader.Leadership(lease)
    kube.fence = leadership.remaining  # no write leaves, or is waited for, past the lead
    health = Health(kube, leadership)
    try:
        runner = await health.start(args.health_port, wiring.routes)
    except OSError as err:
        # A second operator on the same host, or the port of something else: say which flag.
        raise StartupError(
            f"--health-port {args.health_port}: cannot listen ({err.strerror or err})"
        ) from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        acquiring = asyncio.create_task(leader.acquire(kube, leadership))
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({acquiring, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set():
            acquiring.cancel()
            return 0
        lost = asyncio.Event()
        return await _lead(args, kube, wiring, health, leadership, stop, lost)
    finally:
        await runner.cleanup()


async def _lead(
    args: argparse.Namespace,
    kube: Kube,
    wiring: Wiring,
    health: Health,
    leadership: leader.Leadership,
    stop: asyncio.Event,
    lost: asyncio.Event,
) -> int:
    loop = asyncio.get_running_loop()
    cache = Cache(watches.stores())

    def probe_done(owner: Owner) -> None:
        # A verdict was filed: act on it now rather than at the next resync.
        controller.wake(owner)

    rollout = RolloutController(
        kube,
        cache,
        wiring.executor(probe_done, cache),
        probe_url=wiring.probe_url,
        serving=wiring.serving,
    )
    reconciler = Reconciler(kube, cache, rollout, allowed=allowed_by(args))
    controller = Controller(
        reconciler, cache, loop, workers=args.workers, resync_s=args.resync_seconds
    )
    health.controller = controller
    registry = kopf.OperatorRegistry()
    handlers.register(registry, controller)
    settings = handlers.settings()
    stop_kopf = asyncio.Event()
    namespaces = list(args.namespace)
    # Limited to namespaces, kopf's scanning would list all namespaces and watch CRDs (both
    # cluster-wide): without it, it serves the CRD it finds at start, so kopf starts only
    # once the CRD is served (`crd_served`), and the operator needs no cluster-wide read but
    # nodes'.
    settings.scanning.disabled = bool(namespaces)
    controller.start_informers(kube, namespaces)
    tasks = [
        asyncio.create_task(leader.keep(kube, leadership, lost)),
        asyncio.create_task(controller.run(health.synced)),
        asyncio.create_task(_stop_when(stop_kopf, stop, lost)),
    ]
    log.info("operator starting", extra={"namespaces": namespaces or "all"})
    try:
        if not namespaces or await crd_served(kube, stop_kopf):
            await kopf.operator(
                registry=registry,
                settings=settings,
                standalone=True,
                clusterwide=not namespaces,
                namespaces=namespaces,
                stop_flag=stop_kopf,
                ready_flag=health.watching,
            )
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.to_thread(leader.release, kube, leadership.config)
    return 1 if lost.is_set() else 0


CRD_POLL_S = 5.0


async def crd_served(kube: Kube, stopped: asyncio.Event, every: float = CRD_POLL_S) -> bool:
    """Wait until the API server serves DSV4Deployments; False if ``stopped`` comes first.

    Limited to namespaces, kopf serves only the CRDs it finds as it starts: it does not watch
    CRDs (cluster-wide, which the namespaced install may not read).  Started before its CRD
    is established, it would watch nothing, ever, and say nothing.  So it starts only once
    the API's discovery lists the resource, and until then the log says what is missing
    (readiness stays false: kopf is not watching)."""
    waiting = False
    while True:
        try:
            if await asyncio.to_thread(kube.serves, GROUP, VERSION, PLURAL):
                break
            why = "not served"
        except ApiError as err:
            why = f"cannot tell ({err})"
        if not waiting:
            log.warning(
                "the %s CRD is %s: apply crds/dsv4deployment.yaml (manifests/base includes "
                "it); waiting for it, checking every %.0f s",
                CRD_NAME,
                why,
                every,
            )
            waiting = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopped.wait(), every)
            return False
    if waiting:
        log.info("the %s CRD is served: starting to watch DSV4Deployments", CRD_NAME)
    return True


async def _stop_when(stop_kopf: asyncio.Event, *events: asyncio.Event) -> None:
    waits = [asyncio.create_task(e.wait()) for e in events]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    stop_kopf.set()


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging(args.log_level)
    try:
        return asyncio.run(serve(args))
    except StartupError as err:
        print(f"dsv4-operator: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
