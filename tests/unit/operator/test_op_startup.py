"""Starting `dsv4-operator run` where it cannot listen: one line naming the flag, no traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""


def test_a_health_port_in_use_is_one_line_naming_the_flag(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(KUBECONFIG)
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "dsv4_operator.runtime", "run",
             "--health-port", str(port), "--probe-image", "probe:test"],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "KUBECONFIG": str(config)},
        )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"dsv4-operator: --health-port {port}: cannot listen"), last
