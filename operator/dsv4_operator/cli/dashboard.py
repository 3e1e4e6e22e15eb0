"""A link into the shipped Grafana dashboard for one deployment's rollout.

Why a link and not a number: an on-call engineer reading `dsv4ctl rollout report` wants the
picture around the verdict (the corruption rate and its bound against the budget over time,
the engines' HiCache series beside it), and the dashboard already draws it.  Grafana's URL
is the cluster's, not the operator's, so it comes from the person's environment
(``$DSV4_GRAFANA_URL``) or ``--grafana-url``; without one, nothing is printed.

The dashboard's uid and variable names are those of manifests/monitoring/dashboards/dsv4.json
(tests/unit/monitoring/test_dashboard.py checks that they still are).
"""

from __future__ import annotations

import datetime as dt
import os
from typing import Any
from urllib.parse import urlencode, urlsplit

from dsv4_engine.cliutil import CommandError
from dsv4_operator.api.times import parse_stamp

DASHBOARD_UID = "dsv4-operator"
NAMESPACE_VARIABLE, DEPLOYMENT_VARIABLE = "namespace", "deployment"
ENV = "DSV4_GRAFANA_URL"
# Around the rollout: the stable flags before the canary started, and what followed the verdict.
_BEFORE, _AFTER = dt.timedelta(minutes=5), dt.timedelta(minutes=10)
_DECIDED = ("Idle", "RolledBack")


def grafana_base(option: str | None) -> str | None:
    """The Grafana to link to: ``--grafana-url``, else ``$DSV4_GRAFANA_URL``, else none."""
    base = option if option is not None else os.environ.get(ENV)
    if not base:
        return None
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise CommandError(
            f"--grafana-url (or ${ENV}): expected Grafana's http(s) URL, "
            f"such as https://grafana.example.com, got {base!r}",
            exit_code=2,
        )
    return base.rstrip("/")


def dashboard_url(
    base: str, namespace: str, name: str, rollout: dict[str, Any], now: dt.datetime
) -> str:
    """The dashboard for ``namespace/name``, over its latest rollout: from a few minutes
    before the canary started to a while after the verdict (to now while it runs)."""
    query: dict[str, str] = {
        f"var-{NAMESPACE_VARIABLE}": namespace,
        f"var-{DEPLOYMENT_VARIABLE}": name,
    }
    started = rollout.get("startedAt")
    if started:
        query["from"] = str(_millis(parse_stamp(started) - _BEFORE))
        since = rollout.get("phaseSince")
        end = parse_stamp(since) + _AFTER if since and rollout.get("phase") in _DECIDED else now
        query["to"] = str(_millis(end)) if end < now else "now"
    return f"{base}/d/{DASHBOARD_UID}?{urlencode(query)}"


def _millis(when: dt.datetime) -> int:
    return int(when.timestamp() * 1000)
