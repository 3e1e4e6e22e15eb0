"""A fork server for the project's own commands: imported once, each command forked.

A fresh `python -m dsv4_engine.cli serve` spends ~3 CPU-seconds importing torch, aiohttp
and the engine before it serves anything, and a canary e2e test starts a dozen engines and
routers and a probe on a two-core machine.  The server (`python -m
dsv4_dev.localrun.forks`) imports the engine and the CLIs once (``PRELOAD``; a probe still
imports the kubernetes client itself, below); each command is then a
fork of it that calls the entry point a fresh process would (`python -m dsv4_engine.cli`,
or the venv's console script) with the same `sys.argv` — the same code, the environment
given on top of the server's (which is its starter's), output to the log given, in its own
session.  What the server imports must not read the environment as it is imported, and a
command is forked only with variables read when used (``CALL_TIME_ENV``): anything else
would see the server's value, not the command's.

The server reads one JSON request per line on stdin and answers one JSON line each:
``{"fork": entry, "argv": [...], "env": {...}, "log": path}`` → ``{"pid": n}``, and
``{"exit": pid}`` → ``{"code": n}`` (None while it runs; minus the signal that ended it, as
Popen's).  It exits when its stdin closes; the forked commands keep running, as processes
a runtime started would.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NoReturn, TextIO

ENGINE_CLI = (sys.executable, "-m", "dsv4_engine.cli")
# The venv's console scripts forked (what the pods the local runtime plays run), by name.
SCRIPTS = {"dsv4ctl": "dsv4_operator.cli.main:main"}
# What an engine, a router or a probe imports before it works.  Never a module that reads
# the environment as it is imported (``READ_AT_IMPORT``): the fork would keep the server's
# value, not the command's.  The kubernetes client is one (its default kubeconfig is
# $KUBECONFIG as imported): a probe that kept its starter's would probe as the runtime's
# admin, not as its pod's ServiceAccount; so `dsv4ctl probe` imports it after its fork.
PRELOAD = (
    "dsv4_engine.cli",
    "dsv4_engine.commands.router",
    "dsv4_engine.commands.serve",
    "dsv4_engine.reference.router",
    "dsv4_engine.reference.server",
    "dsv4_operator.cli.main",
)
READ_AT_IMPORT = ("kubernetes", "triton")  # TRITON_INTERPRET decides how kernels decorate
# The variables a forked command may be given: each is read when used, not at import
# (fault injection, the kernel backend, Triton's interpreter, a probe's kubeconfig).  A
# command given any other is started fresh instead.
CALL_TIME_ENV = frozenset(
    {"DSV4_INJECT_UNGATED_INDEX_K", "DSV4_KERNEL_BACKEND", "TRITON_INTERPRET", "KUBECONFIG"}
)
POLL_S = 0.05


class ForkServerError(RuntimeError):
    """The fork server is gone, so the commands it forked cannot be followed."""


class ForkServer:
    """The starting side: starts the server on first use, asks it to fork and for exits."""

    def __init__(self) -> None:
        self._server: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the server now (its imports take seconds) rather than at the first fork."""
        with self._lock:
            self._started()

    def fork(self, command: list[str], env: dict[str, str], log_path: Path) -> Forked:
        """``command`` forked, as `processes.popen` starts it (see `fork_target`)."""
        found = fork_target(command, env)
        if found is None:
            raise ValueError(f"not a command this fork server runs: {command} with {env}")
        entry, argv = found
        log_path.touch()  # there once this returns, as Popen's redirected output is
        answer = self._ask({"fork": entry, "argv": argv, "env": env, "log": str(log_path)})
        return Forked(self, command, answer["pid"])

    def exit_code(self, pid: int) -> int | None:
        return self._ask({"exit": pid})["code"]

    def _started(self) -> subprocess.Popen:
        """The server, started on first use.  One that has exited is not started again:
        a new one would not know the commands the old one forked, and would answer that
        they still run."""
        if self._server is None:
            self._server = subprocess.Popen(
                [sys.executable, "-m", __name__],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                start_new_session=True,  # a Ctrl-C meant for its starter is not for it
            )
        return self._server

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            server = self._started()
            assert server.stdin is not None and server.stdout is not None
            try:
                server.stdin.write(json.dumps(request) + "\n")
                server.stdin.flush()
                line = server.stdout.readline()
            except OSError:
                line = ""
            if not line.endswith("\n"):
                raise ForkServerError(f"the fork server exited ({server.poll()})")
            return json.loads(line)


def fork_target(command: list[str], env: dict[str, str]) -> tuple[str, list[str]] | None:
    """(entry point, sys.argv) a fresh process of ``command`` would run — `python -m
    dsv4_engine.cli ARGS` or one of ``SCRIPTS`` in this interpreter's bin folder — or None where a fork server does not run it as that
    process would: another command, or an ``env`` with a variable not in
    ``CALL_TIME_ENV``."""
    if not env.keys() <= CALL_TIME_ENV:
        return None
    if tuple(command[: len(ENGINE_CLI)]) == ENGINE_CLI:
        return "dsv4_engine.cli:main", ["-m", *command[len(ENGINE_CLI) :]]
    script = Path(command[0]) if command else Path()
    if script.parent == Path(sys.executable).parent and script.name in SCRIPTS:
        return SCRIPTS[script.name], command
    return None


class Forked:
    """A forked command with the face of the `subprocess.Popen` it replaces."""

    def __init__(self, server: ForkServer, args: list[str], pid: int) -> None:
        self.args = args
        self.pid = pid
        self.returncode: int | None = None
        self._server = server

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(POLL_S)
        return code


def preload(modules: Iterable[str]) -> TextIO:
    """Imports ``modules`` for a server that forks, and returns where its answers go: a
    private copy of stdout, stdout itself becoming stderr, so that nothing printed (by an
    import, or later) can garble them."""
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    for name in modules:
        importlib.import_module(name)
    return answers


def exit_as_interpreter(main: Callable[[], int | None]) -> NoReturn:
    """Ends a forked child as a fresh interpreter running ``main`` would end: its return
    value or its SystemExit's code as the exit status, the message or the traceback of
    anything else on stderr, and the exit handlers ``main`` registered run (the kubernetes
    client's removes the temp files it wrote a kubeconfig's certificates to).  The handlers
    the forking process registered are dropped first: they are its own (a finalizer of a
    directory it still uses), and `os._exit` ran none of them before either."""
    atexit._clear()  # noqa: SLF001 - no public way to drop what the fork inherited
    code = 1
    try:
        code = main() or 0
    except SystemExit as exit_:
        if isinstance(exit_.code, int) or exit_.code is None:
            code = exit_.code or 0
        else:
            print(exit_.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - reported as a fresh interpreter reports it
        traceback.print_exc()
    finally:
        atexit._run_exitfuncs()  # noqa: SLF001 - what the interpreter runs at exit
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    """The server: preload, then fork and report exits until stdin closes."""
    answers = preload(PRELOAD)
    exits: dict[int, int] = {}
    for line in sys.stdin:
        request = json.loads(line)
        if "fork" in request:
            pid = os.fork()
            if pid == 0:
                answers.close()
                _child(request["fork"], request["argv"], request["env"], request["log"])
            answer: dict[str, Any] = {"pid": pid}
        else:
            _reap(exits)
            answer = {"code": exits.get(request["exit"])}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


def _reap(exits: dict[int, int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        exits[pid] = os.waitstatus_to_exitcode(status)


def _child(entry: str, argv: list[str], env: dict[str, str], log_path: str) -> NoReturn:
    """What a fresh process would do, in a forked server: ``entry()`` with ``argv`` as
    sys.argv (``-m`` for the module's file, as `python -m` sets it)."""

    def run() -> int | None:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        os.environ.update(env)
        module, _, name = entry.partition(":")
        loaded = importlib.import_module(module)
        sys.argv = [loaded.__file__ or module, *argv[1:]] if argv[0] == "-m" else argv
        return getattr(loaded, name)()

    exit_as_interpreter(run)


if __name__ == "__main__":
    serve()
