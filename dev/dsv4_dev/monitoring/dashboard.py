"""The shipped Grafana dashboard (manifests/monitoring/dashboards/dsv4.json) as queries.

Every panel target's PromQL, and the same with the dashboard's template variables
(`$namespace`, `$deployment`) and Grafana's built-in windows (`$__rate_interval`,
`$__range`) replaced, so that a test can run each one against a Prometheus as Grafana
would for one deployment; and a panel drawn as a small SVG chart from what Prometheus
answers its queries (the pictures docs/metrics-and-alerts.md describes: Grafana itself
is not installed here).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from html import escape
from typing import Any

from dsv4_dev.monitoring.config import MONITORING

DASHBOARD = MONITORING / "dashboards" / "dsv4.json"
# What Grafana puts in for its built-in windows when a test has no Grafana: a rate window
# that holds several scrapes at the local 2 s interval, and an hour of dashboard time range.
WINDOWS = {"__rate_interval": "1m", "__range": "1h"}
_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


@dataclass(frozen=True)
class Query:
    panel: str  # the panel's title
    ref: str  # the target's refId
    expr: str


def load() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel that queries (rows only group them)."""
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def queries(dashboard: dict[str, Any]) -> list[Query]:
    return [
        Query(panel["title"], target["refId"], target["expr"])
        for panel in panels(dashboard)
        for target in panel["targets"]
    ]


def expand(expr: str, variables: dict[str, str]) -> str:
    """``expr`` with each `$name` or `${name}` replaced from ``variables`` and ``WINDOWS``;
    a variable neither names is an error, not left in the query."""
    values = {**WINDOWS, **variables}

    def value(found: re.Match[str]) -> str:
        name = found.group(1) or found.group(2)
        if name not in values:
            raise KeyError(f"no value for ${name} in {expr!r}")
        return values[name]

    return _VARIABLE.sub(value, expr)


def legend(target: dict[str, Any], labels: dict[str, str]) -> str:
    """A series' name as Grafana writes it from the target's legendFormat (`{{label}}`)."""
    shown = re.sub(
        r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), target["legendFormat"]
    )
    return shown.strip() or target["refId"]


_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2")
_WIDTH, _LEFT, _TOP, _PLOT_H, _LEGEND = 520, 60, 28, 130, 2  # _LEGEND: names per legend row


def _shown(value: float, unit: str | None) -> str:
    return f"{value:.2%}" if unit == "percentunit" else f"{value:.3g}{' ' + unit if unit else ''}"


def chart(
    title: str,
    unit: str | None,
    series: list[tuple[str, list[tuple[float, float]]]],
    window: tuple[float, float],
) -> str:
    """A small SVG line chart of one panel: ``series`` are (legend, [(unix time, value)]),
    NaN values left out, over ``window`` (unix start and end, every panel's the same); each
    stretch of data is a `class="data"` line, or a dot where it is a single sample."""
    values = [v for _, points in series for _, v in points if v == v]  # v == v: not NaN
    low = min([0.0, *values])
    high = max(values, default=low)
    high = high if high > low else low + 1.0
    start, end = window
    width = _WIDTH - _LEFT - 10
    height = _TOP + _PLOT_H + 24 + 14 * math.ceil(len(series) / _LEGEND)

    def xy(t: float, v: float) -> tuple[float, float]:
        x = _LEFT + (t - start) / (end - start) * width
        return x, _TOP + _PLOT_H - (v - low) / (high - low) * _PLOT_H

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{height}" '
        'font-family="sans-serif" font-size="11">',
        f'<rect width="{_WIDTH}" height="{height}" fill="white"/>',
        f'<text x="{_LEFT}" y="16" font-size="13" font-weight="bold">{escape(title)}</text>',
        f'<rect x="{_LEFT}" y="{_TOP}" width="{width}" height="{_PLOT_H}" fill="none" '
        'stroke="#ccc"/>',
        f'<text x="{_LEFT - 4}" y="{_TOP + 8}" text-anchor="end">{_shown(high, unit)}</text>',
        f'<text x="{_LEFT - 4}" y="{_TOP + _PLOT_H}" text-anchor="end">{_shown(low, unit)}</text>',
        f'<text x="{_LEFT + width}" y="{_TOP + _PLOT_H + 13}" text-anchor="end">'
        f"{(end - start) / 60:.1f} min</text>",
    ]
    for index, (name, points) in enumerate(series):
        colour = _COLOURS[index % len(_COLOURS)]
        runs: list[list[tuple[float, float]]] = [[]]
        for t, v in points:
            if v == v:
                runs[-1].append(xy(t, v))
            elif runs[-1]:
                runs.append([])
        for run in filter(None, runs):
            if len(run) == 1:
                ((x, y),) = run
                out.append(
                    f'<circle class="data" cx="{x:.1f}" cy="{y:.1f}" r="2" fill="{colour}"/>'
                )
            else:
                line = " ".join(f"{x:.1f},{y:.1f}" for x, y in run)
                out.append(
                    f'<polyline class="data" fill="none" stroke="{colour}" stroke-width="1.5" '
                    f'points="{line}"/>'
                )
        row, column = divmod(index, _LEGEND)
        x, y = _LEFT + column * (width // _LEGEND), _TOP + _PLOT_H + 30 + row * 14
        out.append(f'<text x="{x}" y="{y}" fill="{colour}">■ {escape(name[:36])}</text>')
    return "\n".join([*out, "</svg>"]) + "\n"
