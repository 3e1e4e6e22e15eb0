"""The local Prometheus as a companion of a local cluster (`dsv4ctl cluster up --monitoring`).

It scrapes what the shipped ServiceMonitor and PodMonitor select, with the shipped alert
rules (`dsv4_dev.monitoring`), and answers Prometheus's HTTP API on a loopback port.
`alerts` reads the alerts as of data scraped after it was asked, so a caller that has just
seen a rollout decide sees the alerts that decision raised (or did not).
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dsv4_dev.cluster.companion import Companion
from dsv4_dev.cluster.local import ClusterError
from dsv4_dev.monitoring.server import prometheus_binary

ALERTS_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Monitoring(Companion):
    """The local Prometheus of one cluster."""

    folder_name = "monitoring"
    stem = "server"
    module = "dsv4_dev.monitoring.server"
    what = "local Prometheus"

    def arguments(self) -> list[str]:
        return ["--folder", str(self.folder)]

    def start(self) -> int:
        prometheus_binary()  # a missing server is said here, not in the server's log
        if self.pid() is None:
            (self.folder / "url").unlink(missing_ok=True)  # a stopped one's
        return super().start()

    def started(self) -> bool:
        """Once Prometheus answers ready."""
        try:
            with urllib.request.urlopen(f"{self.url()}/-/ready", timeout=2) as response:
                return response.status == 200
        except (ClusterError, OSError):  # not written yet, not listening yet
            return False

    def url(self) -> str:
        """Prometheus's URL (its HTTP API and its UI)."""
        try:
            return (self.folder / "url").read_text()
        except OSError:
            raise ClusterError(
                "the local Prometheus is not running; start it with `dsv4ctl cluster up "
                "--monitoring`"
            ) from None

    def api(self, path: str) -> Any:
        """The `data` of a Prometheus HTTP API answer."""
        url = self.url()
        try:
            with urllib.request.urlopen(f"{url}{path}", timeout=10) as response:
                return json.load(response)["data"]
        except OSError as err:
            raise ClusterError(
                f"the local Prometheus at {url} did not answer {path}: {err}"
            ) from None

    def alerts(self, timeout: float = ALERTS_TIMEOUT_S) -> list[dict[str, Any]]:
        """The alerts pending or firing at a rule evaluation of data scraped after this call
        began: every target scraped since, and every rule group evaluated after that."""
        asked = float(self.api("/api/v1/query?query=time()")["result"][0])
        deadline = time.monotonic() + timeout
        seen = None  # when the last target was first scraped after `asked`
        while True:
            if seen is None:
                targets = self.api("/api/v1/targets?state=active")["activeTargets"]
                scraped = [_unix(t["lastScrape"]) for t in targets]
                if all(at > asked for at in scraped):
                    seen = max(scraped, default=asked)
            if seen is not None:
                groups = self.api("/api/v1/rules?type=alert")["groups"]
                if all(_unix(g["lastEvaluation"]) > seen for g in groups):
                    return self.api("/api/v1/alerts")["alerts"]
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"the local Prometheus has not scraped every target and evaluated its "
                    f"rules within {timeout:.0f}s; see {self.folder / 'prometheus.log'}"
                )
            time.sleep(0.5)

    def status(self) -> dict[str, Any]:
        pid = self.pid()
        return {
            "running": pid is not None,
            "pid": pid,
            "log": str(self.log_path),
            "url": self.url() if pid is not None and self.started() else None,
        }


_STAMP = re.compile(r"^(.*T\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def _unix(stamp: str) -> float:
    """An RFC 3339 time as Prometheus writes it (up to nanoseconds) in Unix seconds."""
    found = _STAMP.match(stamp)
    if found is None:
        raise ValueError(f"not an RFC 3339 time: {stamp!r}")
    whole, fraction, zone = found.groups()
    base = datetime.fromisoformat(whole + zone.replace("Z", "+00:00")).timestamp()
    return base + float(fraction or 0)


def alert_lines(alerts: list[dict[str, Any]]) -> list[str]:
    """One line per alert, as `dsv4ctl cluster alerts` prints them."""
    if not alerts:
        return ["no alert pending or firing"]
    rows = []
    for alert in sorted(alerts, key=lambda a: (a["labels"]["alertname"], a["state"])):
        labels = dict(alert["labels"])
        name = labels.pop("alertname")
        shown = " ".join(f"{key}={value}" for key, value in sorted(labels.items()))
        rows.append(f"{name:<30} {alert['state']:<8} {shown}")
    return rows
