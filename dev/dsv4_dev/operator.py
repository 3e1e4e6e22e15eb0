"""`dsv4-operator-dev run`: the operator as the local cluster and the tests run it.

The same process as the image's `dsv4-operator run` (`dsv4_operator.runtime.serve`), with
what only development needs, none of which the image carries:

* `--local-endpoints`: Services are reached through the local runtime's endpoint map
  (`dsv4_dev.localrun.endpoints`), since nothing on KWOK's fake nodes has a cluster IP, and
  a canary counts as serving once its router answers there, where the probes will reach it
  (not once its Service has a ready endpoint, which nothing here uses).  The process
  publishes itself there too, as the stand-in for the operator Deployment's pod: the local
  endpoint of the operator's metrics Service (manifests/base/service.yaml) is its health
  port, where the local Prometheus scrapes it;  Probes still run
  as Jobs, as in a cluster: the local runtime runs each probe pod's command and reports its
  exit (`dsv4_dev.localrun.probes`), so the probe image is only a name
  (`--probe-image` defaults to `LOCAL_PROBE_IMAGE`);
  the ClusterRoles the install ships for the operator to bind (dsv4-router, dsv4-probe:
  a probe files its report with dsv4-probe's rights) are applied at start, as the install
  would (`install_shipped_cluster_roles`);
* `--probe-mode local`: canary probes run inside this process instead of as Jobs — a
  development shortcut (no Job, no probe pod, no probe ServiceAccount), only with
  `--local-endpoints`;
* `--crash-after-writes N`: exit abruptly (like SIGKILL) before the write after the Nth,
  for the restart-safety tests;
* `/debug/requests` on the health port: the API requests this process made, by verb and
  path (how the tests show a steady-state reconcile writes nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import sys
import urllib.request
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import Any

import urllib3
import yaml
from aiohttp import web

from dsv4_dev.localrun import endpoints
from dsv4_operator import runtime
from dsv4_operator.kube.client import Kube
from dsv4_operator.render.router import ROUTER_CLUSTER_ROLE
from dsv4_operator.rollout.controller import ServiceUrl, Serving
from dsv4_operator.rollout.executor import LocalProbeExecutor
from dsv4_operator.rollout.probe_job import PROBE_CLUSTER_ROLE

log = logging.getLogger("dsv4_dev.operator")
# The probe Jobs' image on the local cluster: nothing pulls it (the local runtime runs the
# Job's command from its venv), so it names what the operator image would be.
LOCAL_PROBE_IMAGE = "dsv4-operator:local"
BASE = Path(__file__).resolve().parents[2] / "manifests" / "base"
# The Service the shipped ServiceMonitor scrapes the operator through.
METRICS_SERVICE = BASE / "service.yaml"
# The ClusterRoles the install ships for the operator to bind, and where.
SHIPPED_CLUSTER_ROLES = (ROUTER_CLUSTER_ROLE, PROBE_CLUSTER_ROLE)
RBAC = BASE / "rbac.yaml"


class ProbeMode(Enum):
    JOB = "job"
    LOCAL = "local"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser, run = runtime.build_parser()
    parser.prog = "dsv4-operator-dev"
    run.add_argument(
        "--crash-after-writes",
        type=int,
        default=None,
        help="Fault injection for tests: exit abruptly (like SIGKILL) after N writes.",
    )
    run.add_argument(
        "--local-endpoints",
        action="store_true",
        help="Local cluster: reach Services through the local runtime's endpoint map, not DNS.",
    )
    run.add_argument(
        "--probe-mode",
        choices=[m.value for m in ProbeMode],
        default=ProbeMode.JOB.value,
        help=(
            "Where canary probes run: 'job' (a Job per attempt with the operator image, the "
            "default) or 'local' (inside this process: a development shortcut, only with "
            "--local-endpoints)."
        ),
    )
    args = parser.parse_args(argv)
    if args.local_endpoints and args.probe_image is None:
        args.probe_image = LOCAL_PROBE_IMAGE
    if args.probe_mode == ProbeMode.LOCAL.value and not args.local_endpoints:
        # In a real cluster the operator's own network may not reach every canary, and a
        # probe inside it dies with it; refuse rather than probe from the wrong place.
        parser.error("--probe-mode local needs --local-endpoints (the local cluster)")
    return args


def answering(service_url: ServiceUrl) -> Serving:
    """A Service serves once its published endpoint answers `/health`."""

    def serving(namespace: str, service: str, port: int) -> bool:
        try:
            url = service_url(namespace, service, port)
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                return response.status == 200
        except (ValueError, OSError) as err:
            log.info("%s.%s not answering yet: %s", service, namespace, err)
            return False

    return serving


def crash_after(kube: Kube, writes: int) -> None:
    """Die like SIGKILL before the write after the ``writes``th is sent."""

    def check() -> None:
        if kube.writes() > writes:
            os._exit(137)

    kube.counted = check


def debug_requests(kube: Kube) -> runtime.Route:
    async def requests(_: web.Request) -> web.Response:
        counts = [
            {"verb": verb, "path": path, "count": n} for (verb, path), n in kube.requests.items()
        ]
        return web.json_response({"writes": kube.writes(), "requests": counts})

    return "/debug/requests", requests


def publish_stand_in(health_port: int) -> None:
    """Publish this process as the local endpoint of the operator's metrics Service (with
    its own client: the writes `Kube` counts are the operator's)."""
    from kubernetes import client

    service = yaml.safe_load(METRICS_SERVICE.read_text())
    (port,) = service["spec"]["ports"]
    meta = service["metadata"]
    key = endpoints.key(meta["name"], meta["namespace"], port["port"])
    data = {key: f"http://127.0.0.1:{health_port}"}
    core = client.CoreV1Api()
    body = {"metadata": {"name": endpoints.STAND_INS}, "data": data}
    try:
        try:
            core.create_namespaced_config_map(endpoints.NAMESPACE, body)
        except client.ApiException as err:
            if err.status != 409:
                raise
            core.patch_namespaced_config_map(endpoints.STAND_INS, endpoints.NAMESPACE, body)
    except (client.ApiException, urllib3.exceptions.HTTPError) as err:  # refused, unreachable
        log.warning(
            "not published as %s (the local Prometheus will not scrape this process): %s",
            endpoints.label(key),
            err,
        )
        return
    log.info("published as %s", endpoints.label(key))


def install_shipped_cluster_roles(api: Any = None) -> None:
    """Apply the ClusterRoles the operator binds its routers' and probes' accounts to, as
    the install ships them (a local cluster has no install); ``api``: a kubernetes
    ApiClient (None: the default configuration).  With its own client: the writes `Kube`
    counts are the operator's."""
    from kubernetes import client

    rbac = client.RbacAuthorizationV1Api(api)
    for doc in yaml.safe_load_all(RBAC.read_text()):
        if (
            doc
            and doc["kind"] == "ClusterRole"
            and doc["metadata"]["name"] in SHIPPED_CLUSTER_ROLES
        ):
            try:
                rbac.create_cluster_role(doc)
            except client.ApiException as err:
                if err.status != 409:
                    raise
                rbac.replace_cluster_role(doc["metadata"]["name"], doc)


def dev_wiring(kube: Kube, args: argparse.Namespace) -> runtime.Wiring:
    if args.crash_after_writes is not None:
        crash_after(kube, args.crash_after_writes)
    if args.probe_mode == ProbeMode.JOB.value:
        install_shipped_cluster_roles()
        wiring = runtime.job_wiring(kube, args)
    else:
        wiring = runtime.Wiring(
            executor=lambda done, _: LocalProbeExecutor(kube, asyncio.get_running_loop(), done),
        )
    if args.local_endpoints:
        publish_stand_in(args.health_port)
        local = endpoints.resolver(kube)
        wiring = dataclasses.replace(wiring, serving=answering(local))
        if args.probe_mode == ProbeMode.LOCAL.value:
            wiring = dataclasses.replace(wiring, probe_url=local)
    return dataclasses.replace(wiring, routes=[*wiring.routes, debug_requests(kube)])


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    runtime.setup_logging(args.log_level)
    return asyncio.run(runtime.serve(args, dev_wiring))


if __name__ == "__main__":
    sys.exit(main())
