"""The local runtime's processes: a `dsv4-engine` command is forked from the fork server
(the engine imported once) and behaves as the fresh process it replaces — its argv, its
environment, its log, its exit code, its own session, stopped by SIGTERM."""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from dsv4_dev.localrun import processes
from dsv4_dev.localrun.forks import (
    ENGINE_CLI,
    PRELOAD,
    READ_AT_IMPORT,
    Forked,
    ForkServer,
    ForkServerError,
    exit_as_interpreter,
)
from dsv4_dev.localrun.runtime import free_port
from dsv4_dev.sglang_router import LAUNCH
from tests.unit.operator.test_op_startup import KUBECONFIG

WAIT_S = 60.0


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _until(what: str, check, timeout_s: float = WAIT_S) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not {what} after {timeout_s} s"
        time.sleep(0.1)


def test_an_engine_command_is_forked_and_logs_and_exits_as_a_fresh_process_would(tmp_path):
    log = tmp_path / "router.log"
    started = processes.popen([*ENGINE_CLI, "router", "--port", "1"], {}, log)
    assert isinstance(started, Forked)
    assert started.wait(WAIT_S) == 2  # argparse: --prefill and --decode are required
    assert "the following arguments are required: --prefill" in log.read_text()
    assert started.returncode == started.poll() == 2


def test_the_environment_reaches_the_forked_engine(tmp_path):
    log = tmp_path / "engine.log"
    env = {"DSV4_INJECT_UNGATED_INDEX_K": "sometimes"}
    port = free_port()
    started = processes.popen([*ENGINE_CLI, "serve", "--port", str(port)], env, log)
    assert started.wait(WAIT_S) != 0
    assert "DSV4_INJECT_UNGATED_INDEX_K='sometimes'" in log.read_text()
    assert "DSV4_INJECT_UNGATED_INDEX_K" not in os.environ  # the child's, not the runtime's


def test_a_forked_engine_serves_in_its_own_session_and_stops_on_sigterm(tmp_path):
    log = tmp_path / "engine.log"
    port = free_port()
    started = processes.popen([*ENGINE_CLI, "serve", "--port", str(port)], {}, log)
    try:

        def answers() -> bool:
            assert started.poll() is None, log.read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        _until("serving", answers)
        assert os.getpgid(started.pid) == started.pid  # its own session, as Popen's
        assert _parent(started.pid) != os.getpid()  # forked by the fork server, not here
        with pytest.raises(subprocess.TimeoutExpired):
            started.wait(0.1)
    finally:
        processes.terminate(started)
    assert started.poll() is not None
    assert started.returncode in (0, -signal.SIGTERM)


def test_other_commands_are_started_as_they_are(tmp_path):
    log = tmp_path / "echo.log"
    started = processes.popen([sys.executable, "-c", "print('plain')"], {}, log)
    assert isinstance(started, subprocess.Popen)
    assert started.wait(WAIT_S) == 0
    assert log.read_text() == "plain\n"


def test_a_probe_jobs_dsv4ctl_is_forked_with_its_argv(tmp_path):
    log = tmp_path / "probe.log"
    dsv4ctl = str(Path(sys.executable).parent / "dsv4ctl")
    started = processes.popen([dsv4ctl, "probe", "--help"], {}, log)
    assert isinstance(started, Forked)
    assert started.wait(WAIT_S) == 0
    assert log.read_text().startswith("usage: dsv4ctl probe")


def test_a_command_the_fork_server_does_not_know_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not a command this fork server runs"):
        processes.FORKS.fork(["sleep", "1"], {}, tmp_path / "x.log")


def test_the_router_pods_command_starts_sglang_router_without_importing_sglang(tmp_path):
    """sglang-router's launcher would import all of SGLang (torch, Triton) for its MiniLB's
    tracing; the router pod's command (`ROUTER_COMMAND`, the same here with this venv's
    python) starts it without: its `--help` prints the router's flags and no SGLang module
    is imported.  It is started as it is, not forked (the engines' server refuses it)."""
    router = [*LAUNCH, "--help"]
    with pytest.raises(ValueError, match="not a command this fork server runs"):
        processes.FORKS.fork(router, {}, tmp_path / "refused.log")
    log = tmp_path / "router.log"
    started = processes.popen([sys.executable, "-X", "importtime", *router[1:]], {}, log)
    assert not isinstance(started, Forked)
    assert started.wait(WAIT_S) == 0
    text = log.read_text()
    assert "--service-discovery" in text
    imported = {
        line.rsplit("|", 1)[1].strip()
        for line in text.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "sglang_router.launch_router" in imported
    # Only the marked module's lookup, none of SGLang's (its package, torch) loaded.
    assert {m for m in imported if m.split(".")[0] in ("sglang", "torch", "triton")} == {
        "sglang.srt.tracing.trace"
    }


def test_the_fork_server_imports_nothing_that_reads_the_environment_as_it_is_imported():
    """A module that reads a variable at import would keep the fork server's value in every
    fork: the kubernetes client's default kubeconfig ($KUBECONFIG), which would make a
    forked probe act as the runtime's admin instead of its pod's ServiceAccount."""
    check = (
        "import importlib, sys\n"
        f"for name in {PRELOAD!r}: importlib.import_module(name)\n"
        f"print(sorted(m for m in {READ_AT_IMPORT!r} if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_forked_probe_reads_its_own_kubeconfig(tmp_path, monkeypatch):
    """The kubeconfig a forked `dsv4ctl` uses is the one its environment names, not the one
    its fork server started with: here the server's is valid (a cluster that refuses) and
    the command's is none at all, so reading the server's would fail otherwise."""
    servers = tmp_path / "server.kubeconfig"
    servers.write_text(KUBECONFIG)
    monkeypatch.setenv("KUBECONFIG", str(servers))
    server = ForkServer()
    log = tmp_path / "rollout.log"
    dsv4ctl = str(Path(sys.executable).parent / "dsv4ctl")
    command = [dsv4ctl, "rollout", "status", "flash", "-n", "default"]
    started = server.fork(command, {"KUBECONFIG": str(tmp_path / "absent")}, log)
    assert started.wait(WAIT_S) != 0
    assert "cannot load kubeconfig" in log.read_text(), log.read_text()


def test_a_command_given_a_variable_read_at_import_is_started_fresh(tmp_path):
    log = tmp_path / "router.log"
    command = [*ENGINE_CLI, "router", "--port", "1"]
    started = processes.popen(command, {"PYTHONWARNINGS": "error"}, log)
    assert isinstance(started, subprocess.Popen)
    assert started.wait(WAIT_S) == 2


def test_a_fork_server_that_died_is_an_error_not_a_command_still_running(tmp_path):
    """A new server would not know the old one's commands and would answer that they
    run: the runtime is told the server is gone instead."""
    server = ForkServer()
    log = tmp_path / "router.log"
    started = server.fork([*ENGINE_CLI, "router", "--port", "1"], {}, log)
    assert started.wait(WAIT_S) == 2
    assert server._server is not None
    server._server.kill()
    server._server.wait(WAIT_S)
    with pytest.raises(ForkServerError, match="the fork server exited"):
        server.fork([*ENGINE_CLI, "router", "--port", "1"], {}, log)


def test_a_forked_child_runs_its_own_exit_handlers_and_not_its_forkers(tmp_path):
    """A fresh interpreter runs the exit handlers it registered (the kubernetes client's
    removes the certificate files it wrote to /tmp; a fork that skipped them left ~7 a
    `make test`); the ones the fork server registered are its own and must not run."""
    ours, theirs = tmp_path / "child-handler-ran", tmp_path / "server-handler-ran"

    def server_handler() -> None:
        theirs.touch()

    def main() -> int:
        atexit.register(ours.touch)
        return 3

    atexit.register(server_handler)
    try:
        pid = os.fork()
        if pid == 0:
            exit_as_interpreter(main)
        _, status = os.waitpid(pid, 0)
    finally:
        atexit.unregister(server_handler)
    assert os.waitstatus_to_exitcode(status) == 3
    assert ours.exists()
    assert not theirs.exists()
