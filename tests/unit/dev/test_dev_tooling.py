"""Development tooling lives in dsv4-dev, apart from what the operator image installs: the
production package never imports it, the image never copies it, and the development
launcher keeps its switches to itself."""

from __future__ import annotations

import ast
import os
import socket
import subprocess
import tomllib
from pathlib import Path

import pytest

from dsv4_dev import operator as dev_operator
from dsv4_dev.cli import cluster as cluster_cli
from dsv4_dev.localrun import endpoints
from dsv4_operator.cli.main import PLUGINS
from dsv4_operator.kube.cache import Cache
from dsv4_operator.kube.client import Kube
from dsv4_operator.rollout.executor import LocalProbeExecutor
from dsv4_operator.rollout.job_executor import JobProbeExecutor

ROOT = Path(__file__).resolve().parents[3]


def imported_modules(package: Path) -> set[str]:
    found = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                found.add(node.module)
    return found


@pytest.mark.parametrize("package", ["operator/dsv4_operator", "engine/dsv4_engine"])
def test_no_production_package_imports_the_development_tooling(package):
    modules = imported_modules(ROOT / package)
    assert modules, package
    assert not [m for m in modules if m.split(".")[0] == "dsv4_dev"]


def test_the_images_do_not_install_the_development_tooling():
    for image in ("engine", "operator"):
        dockerfile = (ROOT / "images" / image / "Dockerfile").read_text()
        assert "dev/" not in dockerfile and "dsv4_dev" not in dockerfile, image
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert "dev" in ignored  # not even sent to the build


def test_dsv4ctl_cluster_is_a_plugin_of_the_development_distribution():
    pyproject = tomllib.loads((ROOT / "dev" / "pyproject.toml").read_text())
    commands = pyproject["project"]["entry-points"][PLUGINS]
    assert commands == {"cluster": cluster_cli.__name__}
    assert callable(cluster_cli.register)
    assert "dsv4_operator.cli.cluster" not in str(
        tomllib.loads((ROOT / "operator" / "pyproject.toml").read_text())
    )


def test_probes_run_as_jobs_on_the_local_cluster_too_and_in_process_only_when_asked(capsys):
    args = dev_operator.parse_args(["run", "--local-endpoints"])
    assert args.probe_mode == dev_operator.ProbeMode.JOB.value
    # Nothing pulls it (the local runtime runs the Job's command): a name, not a lookup.
    assert args.probe_image == dev_operator.LOCAL_PROBE_IMAGE
    args = dev_operator.parse_args(["run", "--local-endpoints", "--probe-image", "op:1"])
    assert args.probe_image == "op:1"
    assert dev_operator.parse_args(["run"]).probe_image is None  # the operator pod's own
    args = dev_operator.parse_args(["run", "--local-endpoints", "--probe-mode", "local"])
    assert args.probe_mode == "local"
    with pytest.raises(SystemExit) as exit_info:
        dev_operator.parse_args(["run", "--probe-mode", "local"])
    assert exit_info.value.code == 2
    assert "--probe-mode local needs --local-endpoints" in capsys.readouterr().err


def wiring(*argv: str):
    kube = Kube(api=None)
    return kube, dev_operator.dev_wiring(kube, dev_operator.parse_args(["run", *argv]))


def test_the_local_wiring_probes_in_process_through_the_endpoint_map(monkeypatch):
    kube, local = wiring("--local-endpoints", "--probe-mode", "local")
    with socket.socket() as closed:  # bound, never listening: nothing answers there
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        published = {"data": {endpoints.key("svc", "ns", 8000): url}}
        monkeypatch.setattr(kube, "get", lambda kind, ns, name: published)  # the API's answer
        assert local.probe_url("ns", "svc", 8000) == url
        assert local.serving("ns", "svc", 8000) is False
    assert [path for path, _ in local.routes] == ["/debug/requests"]


@pytest.mark.asyncio
async def test_the_local_executor_is_made_on_the_running_loop():
    _, local = wiring("--local-endpoints", "--probe-mode", "local")
    assert isinstance(local.executor(lambda owner: None, Cache([])), LocalProbeExecutor)


@pytest.fixture
def applied_roles(monkeypatch) -> list[None]:
    """Job mode applies the install's shipped ClusterRoles at start: recorded (no cluster)."""
    calls: list[None] = []
    monkeypatch.setattr(dev_operator, "install_shipped_cluster_roles", lambda: calls.append(None))
    return calls


def test_job_mode_on_the_local_cluster_probes_by_cluster_dns(applied_roles):
    _, jobs = wiring("--local-endpoints")
    assert isinstance(jobs.executor(lambda owner: None, Cache([])), JobProbeExecutor)
    assert jobs.probe_url("ns", "svc", 8000) == "http://svc.ns.svc:8000"
    assert applied_roles == [None]  # dsv4-probe: what a probe files its report with


def test_crash_injection_counts_writes_only(monkeypatch, applied_roles):
    exits = []
    monkeypatch.setattr(dev_operator.os, "_exit", exits.append)
    kube, _ = wiring("--local-endpoints", "--crash-after-writes", "1")
    kube.requests[("GET", "/api/v1/pods")] += 5
    kube.counted()
    assert exits == []
    kube.requests[("PATCH", "/api/v1/namespaces/ns/configmaps/a")] += 1
    kube.counted()
    assert exits == []
    kube.requests[("PATCH", "/api/v1/namespaces/ns/configmaps/b")] += 1
    kube.counted()
    assert exits == [137]


def test_make_runs_python_writing_bytecode_even_where_the_environment_forbids_it():
    """`make test` starts hundreds of Python processes; with PYTHONDONTWRITEBYTECODE set (as
    on the CI machines) each would compile the project's modules and rewrite the tests anew."""
    probe = 'pycheck: ; @python3 -c "import sys; print(sys.flags.dont_write_bytecode)"'
    out = subprocess.run(
        ["make", "-s", "--no-print-directory", "--eval", probe, "pycheck"],
        cwd=ROOT,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "0"
