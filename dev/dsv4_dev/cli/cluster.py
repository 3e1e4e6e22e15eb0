"""`dsv4ctl cluster up|down|status|kubeconfig|url|alerts`: the local control plane with fake
GPU nodes, with `up --engines` the local runtime that makes their engine pods answer, and
with `up --monitoring` a Prometheus that scrapes them as the shipped monitors say."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from dsv4_dev.cluster.binaries import MissingBinaryError, cache_dir
from dsv4_dev.cluster.engines import Engines
from dsv4_dev.cluster.local import ClusterError, LocalCluster
from dsv4_dev.cluster.lws import LwsError
from dsv4_dev.cluster.monitoring import Monitoring, alert_lines
from dsv4_dev.cluster.nodes import default_pools
from dsv4_dev.localrun import endpoints
from dsv4_dev.monitoring.server import prometheus_binary
from dsv4_engine.cliutil import CommandError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "cluster",
        help="local Kubernetes control plane with fake Blackwell GPU nodes",
        description="A real kube-apiserver, controller-manager, scheduler and etcd (built by "
        "`make control-plane`) with KWOK nodes labelled and sized like Blackwell GPU nodes, "
        "and the LeaderWorkerSet controller (its CRDs and webhooks) for multi-node replicas.",
    )
    parser.add_argument("--name", default="dsv4", help="cluster name (default: dsv4)")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where cluster state lives (default: $DSV4_CACHE_DIR/kwok)",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = actions.add_parser("up", help="start the cluster (idempotent)")
    up.add_argument("--gpu-nodes", type=_int_in(0), default=4, help="GPU nodes (default 4)")
    up.add_argument("--cpu-nodes", type=_int_in(0), default=2, help="CPU nodes (default 2)")
    up.add_argument("--gpu-product", default="NVIDIA-B200", help="nvidia.com/gpu.product label")
    up.add_argument("--gpus-per-node", type=_int_in(1), default=8, help="GPUs per node (default 8)")
    up.add_argument(
        "--gpu-cliques",
        type=_int_in(0),
        default=0,
        help="split the GPU nodes into this many NVLink domains, labelled nvidia.com/gpu.clique "
        "(GB200 NVL72 racks; default 0: no label)",
    )
    up.add_argument(
        "--port", type=_int_in(1, 65535), default=None, help="kube-apiserver port (default: free)"
    )
    up.add_argument(
        "--engines",
        action="store_true",
        help="also start the local runtime: every engine pod of an `engine: reference` "
        "deployment on a fake node runs the CPU reference engine, and its router the router, "
        "on a loopback port (`cluster status` lists them, `cluster url` gives one); run the "
        "operator with `dsv4-operator-dev run --local-endpoints` to reach them",
    )
    up.add_argument(
        "--monitoring",
        action="store_true",
        help="also start a Prometheus server (Debian's `prometheus` package) that scrapes the "
        "operator and the engines as the ServiceMonitor and PodMonitor of manifests/monitoring "
        "select them, every 2 s, with the PrometheusRule's alerts (`cluster status` gives its "
        "URL, `cluster alerts` lists what fires)",
    )
    actions.add_parser(
        "down", help="stop every process the cluster started (engines included) and remove it"
    )
    status = actions.add_parser(
        "status", help="show whether the cluster runs, its nodes, and its engines and their ports"
    )
    status.add_argument("--output", choices=("table", "json"), default="table")
    actions.add_parser("kubeconfig", help="print the kubeconfig path")
    actions.add_parser(
        "alerts",
        help="list the alerts pending or firing in the local Prometheus (`up --monitoring`), "
        "as of data scraped after the command started",
    )
    url = actions.add_parser(
        "url", help="print the loopback URL where a Service answers through the local runtime"
    )
    url.add_argument("service", help="the Service, e.g. flash-router")
    url.add_argument("-n", "--namespace", default="default")
    url.add_argument(
        "--port",
        type=_int_in(1, 65535),
        default=None,
        help="the Service port (default: its only one)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cluster = LocalCluster(name=args.name, workdir=args.workdir or cache_dir() / "kwok")
    try:
        if args.action == "up":
            cluster.pools = default_pools(
                gpu_nodes=args.gpu_nodes,
                gpu_product=args.gpu_product,
                gpus_per_node=args.gpus_per_node,
                cpu_nodes=args.cpu_nodes,
                gpu_cliques=args.gpu_cliques,
            )
            cluster.apiserver_port = args.port
            if args.monitoring:
                prometheus_binary()  # missing: said before anything starts
            cluster.up(log=_log)
            if args.engines:
                engines = Engines(cluster)
                pid = engines.start()
                _log(
                    f"cluster {args.name}: local runtime running (pid {pid}), log {engines.log_path}"
                )
            if args.monitoring:
                monitoring = Monitoring(cluster)
                monitoring.start()
                _log(f"cluster {args.name}: Prometheus at {monitoring.url()}")
        elif args.action == "down":
            if Monitoring(cluster).stop():
                _log(f"cluster {args.name}: Prometheus stopped")
            if Engines(cluster).stop():
                _log(f"cluster {args.name}: local runtime and its engines stopped")
            cluster.down(log=_log)
        elif args.action == "kubeconfig":
            if not cluster.exists():
                raise CommandError(f"cluster {args.name} does not exist; run `dsv4ctl cluster up`")
            print(cluster.kubeconfig)
        elif args.action == "url":
            print(Engines(cluster).url(args.service, args.namespace, args.port))
        elif args.action == "alerts":
            print("\n".join(alert_lines(Monitoring(cluster).alerts())))
        else:
            info = cluster.status()
            info["engines"] = Engines(cluster).status() if info["reachable"] else None
            info["monitoring"] = Monitoring(cluster).status()
            return _print_status(info, args.output)
    except (ClusterError, MissingBinaryError, LwsError, ValueError) as err:
        raise CommandError(str(err), exit_code=1) from None
    return 0


def _print_status(info: dict, output: str) -> int:
    if output == "json":
        print(json.dumps(info, indent=2))
    elif not info["exists"]:
        print(f"cluster {info['name']}: not created")
    else:
        state = "running" if info["reachable"] else "created but not reachable"
        lws = "running" if info["lwsController"] else "not running"
        print(f"cluster {info['name']}: {state}; kubeconfig {info['kubeconfig']}; LWS {lws}")
        for node in info["nodes"]:
            ready = "Ready" if node["ready"] else "NotReady"
            product = node["gpuProduct"] or "-"
            clique = f" clique={node['clique']}" if node["clique"] else ""
            print(f"  {node['name']:<16} {ready:<9} {product:<14} gpus={node['gpus']}{clique}")
        _print_engines(info["engines"])
        _print_monitoring(info["monitoring"])
    return 0 if info["reachable"] else 1


def _print_engines(engines: dict | None) -> None:
    if engines is None:
        return
    if not engines["running"]:
        print("engines: not running (start them with `dsv4ctl cluster up --engines`)")
        return
    print(f"engines: local runtime running (pid {engines['pid']}), log {engines['log']}")
    if not engines["endpoints"]:
        print("  none yet: apply a DSV4Deployment with `engine: reference`")
    for key, url in sorted(engines["endpoints"].items()):
        print(f"  {endpoints.label(key):<48} {url}")


def _print_monitoring(monitoring: dict) -> None:
    if monitoring["running"]:
        where = monitoring["url"] or "starting"
        print(f"monitoring: Prometheus at {where} (pid {monitoring['pid']})")
    else:
        print("monitoring: not running (start it with `dsv4ctl cluster up --monitoring`)")


def _log(message: str) -> None:
    print(message, file=sys.stderr)


def _int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high]; anything else is a usage error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bounds = f">= {low}" if high is None else f"{low}-{high}"
            raise argparse.ArgumentTypeError(f"expected an integer {bounds}, got {text}")
        return value

    return parse
