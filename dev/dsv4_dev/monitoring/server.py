"""`python -m dsv4_dev.monitoring.server --folder DIR`: the local cluster's Prometheus.

Writes the configuration generated from the shipped monitors and rules (`config`) into
DIR, starts the Prometheus server on a free loopback port (its URL in DIR/url, its log in
DIR/prometheus.log, its data in DIR/data) and serves it the cluster's targets
(`discovery`) until SIGTERM, which stops Prometheus too, or until Prometheus exits.  `dsv4ctl cluster up --monitoring`
runs it beside the cluster ($KUBECONFIG names the cluster).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import signal
import sys
from pathlib import Path

from dsv4_dev.cluster.binaries import MissingBinaryError
from dsv4_dev.localrun import processes
from dsv4_dev.localrun.runtime import free_port
from dsv4_dev.monitoring import config, discovery

log = logging.getLogger("dsv4_dev.monitoring")


def prometheus_binary() -> Path:
    found = shutil.which("prometheus")
    if found is None:
        raise MissingBinaryError(
            "prometheus not found on PATH; install Debian's `prometheus` package, which has "
            "the server beside promtool: `make system-deps` (hack/system-deps.sh)"
        )
    return Path(found)


def main(argv: list[str] | None = None) -> int:
    from kubernetes import config as kube_config

    from dsv4_operator.kube.client import Kube

    parser = argparse.ArgumentParser(prog="python -m dsv4_dev.monitoring.server")
    parser.add_argument("--folder", type=Path, required=True)
    folder = parser.parse_args(argv).folder
    logging.basicConfig(level=logging.INFO, format="%(asctime)s monitoring %(message)s")
    binary = prometheus_binary()
    kube = Kube(kube_config.new_client_from_config())
    targets = discovery.server(free_port(), kube)
    config_path = config.write(folder, f"http://127.0.0.1:{targets.server_port}")
    port = free_port()
    prometheus = processes.popen(
        [
            str(binary),
            f"--config.file={config_path}",
            f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        {},
        folder / "prometheus.log",
    )
    (folder / "url").write_text(f"http://127.0.0.1:{port}")
    log.info("Prometheus on http://127.0.0.1:%d, config %s", port, config_path)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    targets.timeout = 1.0  # so a Prometheus that exits is seen within a second
    try:
        while prometheus.poll() is None:
            targets.handle_request()
    finally:
        processes.terminate(prometheus)
        targets.server_close()
    log.error("Prometheus exited (%s); see %s", prometheus.returncode, folder / "prometheus.log")
    return 1


if __name__ == "__main__":
    sys.exit(main())
