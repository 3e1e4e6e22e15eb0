"""A background process that lives beside a local cluster (the local runtime, Prometheus).

`dsv4ctl cluster up --engines` or `--monitoring` starts one; it outlives the command, as the
cluster does.  Its state (pid, log, what it writes) lives in a folder of the cluster's, so
`down` finds and stops it, and anything it left behind is a leftover process of that folder.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from dsv4_dev.cluster.local import ClusterError, LocalCluster

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Companion:
    """`python -m <module>` beside one cluster; a subclass says what it is and when it has
    started."""

    cluster: LocalCluster
    folder_name = ""
    stem = ""  # of its log and pid files
    module = ""
    what = ""  # as a person names it, in errors

    @property
    def folder(self) -> Path:
        return self.cluster.cluster_dir / self.folder_name

    @property
    def log_path(self) -> Path:
        return self.folder / f"{self.stem}.log"

    @property
    def _pid_path(self) -> Path:
        return self.folder / f"{self.stem}.pid"

    def arguments(self) -> list[str]:
        """Arguments after `python -m <module>`."""
        return []

    def environment(self) -> dict[str, str]:
        return self.cluster.env

    def started(self) -> bool:
        """Whether the process has come far enough for `start` to return."""
        raise NotImplementedError

    def pid(self) -> int | None:
        """The process id while it runs, else None."""
        try:
            pid = int(self._pid_path.read_text())
        except (OSError, ValueError):
            return None
        return pid if self._alive(pid) else None

    def start(self) -> int:
        """Start the process (once) and wait until it has started."""
        running = self.pid()
        if running is not None:
            return running
        self.folder.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("a") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", self.module, *self.arguments()],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                start_new_session=True,  # outlives `dsv4ctl cluster up`, as the cluster does
            )
        self._pid_path.write_text(str(proc.pid))
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.started():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ClusterError(
                    f"the {self.what} did not start (exit {proc.poll()}); see {self.log_path}"
                )
            time.sleep(0.2)
        return proc.pid

    def stop(self) -> bool:
        """SIGTERM the process, which stops everything it started; True if it ran."""
        pid = self.pid()
        if pid is None:
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while self._alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if self._alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._pid_path.unlink(missing_ok=True)
        return True

    def _alive(self, pid: int) -> bool:
        """True while ``pid`` runs this module (not a zombie, exited but not yet reaped, nor
        another process that got its number since)."""
        proc = Path(f"/proc/{pid}")
        try:
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            command = (proc / "cmdline").read_bytes()
        except OSError:
            return False
        return state != "Z" and self.module.encode() in command
