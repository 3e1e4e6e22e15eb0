"""A self-contained HTML page for a probe report: inline SVG, no external assets.

Why SVG drawn here rather than a charting library: the page must open from a CI artifact
or an air-gapped cluster, and the operator image carries no JavaScript bundle.  The one
inline script only checks that every chart laid out with a non-zero size and marks the
body (`data-rendered="yes"`), which the headless-browser test reads back.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any

from dsv4_engine.probe.report import summary_table

_W, _H, _PAD = 720, 260, 44
_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:980px}
h1{font-size:20px} h2{font-size:16px;margin-top:28px}
.badge{display:inline-block;padding:2px 10px;border-radius:4px;color:#fff;font-weight:600}
.PASS{background:#2a7d2e}.FAIL{background:#b3261e}.INCONCLUSIVE{background:#8a6d00}
pre{background:#f5f5f5;padding:10px;overflow-x:auto;white-space:pre-wrap}
svg{background:#fcfcfc;border:1px solid #ddd} .axis{stroke:#888} text{font-size:11px;fill:#444}
table{border-collapse:collapse} td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
table.examples{width:100%;table-layout:fixed} table.examples td{vertical-align:top}
"""
_CHECK = """
(function(){
  var charts=document.querySelectorAll('svg.chart'), ok=charts.length===3;
  charts.forEach(function(c){var b=c.getBBox(); if(!(b.width>0&&b.height>0)) ok=false;});
  document.body.setAttribute('data-rendered', ok ? 'yes' : 'no');
})();
"""


def _x(i: float, n: float) -> float:
    return _PAD + (_W - 2 * _PAD) * (i / n if n else 0)


def _y(v: float, top: float) -> float:
    return _H - _PAD - (_H - 2 * _PAD) * min(v, top) / top


def _frame(title: str, x_label: str, y_label: str, top: str, body: str, chart_id: str) -> str:
    return (
        f'<svg class="chart" id="{chart_id}" width="{_W}" height="{_H}" '
        f'viewBox="0 0 {_W} {_H}" xmlns="http://www.w3.org/2000/svg" role="img">'
        f"<title>{escape(title)}</title>"
        f'<line class="axis" x1="{_PAD}" y1="{_H - _PAD}" x2="{_W - _PAD}" y2="{_H - _PAD}"/>'
        f'<line class="axis" x1="{_PAD}" y1="{_PAD}" x2="{_PAD}" y2="{_H - _PAD}"/>'
        f'<text x="{_W / 2}" y="{_H - 8}" text-anchor="middle">{escape(x_label)}</text>'
        f'<text x="6" y="{_PAD - 10}">{escape(y_label)} (top {escape(top)})</text>'
        f"{body}</svg>"
    )


def _rate_chart(report: dict[str, Any]) -> str:
    series, threshold = report["series"], report["threshold"]
    n = series[-1]["n"] if series else 1
    final_upper = series[-1]["upper"] if series else 1.0
    top = min(
        1.0,
        max(4 * threshold, 1.5 * max((p["rate"] for p in series), default=0), 1.5 * final_upper),
    )
    band_up = [(_x(p["n"], n), _y(p["upper"], top)) for p in series]
    band_lo = [(_x(p["n"], n), _y(p["fail_lower"], top)) for p in reversed(series)]
    band = " ".join(f"{x:.1f},{y:.1f}" for x, y in band_up + band_lo)
    line = " ".join(f"{_x(p['n'], n):.1f},{_y(p['rate'], top):.1f}" for p in series)
    ty = _y(threshold, top)
    body = (
        f'<polygon points="{band}" fill="#9ecae1" fill-opacity="0.5"/>'
        f'<polyline points="{line}" fill="none" stroke="#08519c" stroke-width="1.5"/>'
        f'<line x1="{_PAD}" y1="{ty:.1f}" x2="{_W - _PAD}" y2="{ty:.1f}" stroke="#b3261e" '
        f'stroke-dasharray="5,4"/><text x="{_W - _PAD}" y="{ty - 4:.1f}" text-anchor="end" '
        f'fill="#b3261e">threshold {threshold:.2%}</text>'
        f'<text x="{_W - _PAD}" y="{_H - _PAD + 14}" text-anchor="end">{n}</text>'
        f'<text x="{_PAD + 8}" y="{_PAD + 12}">line: failure rate; band: FAIL lower bound '
        f"to PASS upper bound ({report['confidence']:.0%}); dashed: threshold</text>"
    )
    return _frame(
        "Running failure rate (corrupt answers and failed requests) with its confidence band (FAIL lower bound to PASS upper bound)",
        "judged samples",
        "failure rate",
        f"{top:.1%}",
        body,
        "rate-chart",
    )


def _bars(items: list[tuple[str, int]], title: str, x_label: str, chart_id: str, color: str) -> str:
    peak = max((c for _, c in items), default=0) or 1
    width = (_W - 2 * _PAD) / max(1, len(items))
    bars = []
    for i, (label, count) in enumerate(items):
        x, y = _PAD + i * width, _y(count, peak)
        bars.append(
            f'<rect x="{x + 1:.1f}" y="{y:.1f}" width="{max(1.0, width - 2):.1f}" '
            f'height="{_H - _PAD - y:.1f}" fill="{color}"><title>{escape(label)}: {count}</title></rect>'
        )
        if len(items) > 12 and i in (0, len(items) - 1):
            anchor = "start" if i == 0 else "end"
            edge = x if i == 0 else x + width
            bars.append(
                f'<text x="{edge:.1f}" y="{_H - _PAD + 14}" text-anchor="{anchor}">'
                f"{escape(label)}</text>"
            )
        if len(items) <= 12:
            bars.append(
                f'<text x="{x + width / 2:.1f}" y="{_H - _PAD + 14}" text-anchor="middle">'
                f"{escape(label[:14])}</text>"
                f'<text x="{x + width / 2:.1f}" y="{y - 3:.1f}" text-anchor="middle">{count}</text>'
            )
    return _frame(title, x_label, "count", str(peak), "".join(bars), chart_id)


def render_html(report: dict[str, Any]) -> str:
    classes = [(name, n) for name, n in report["counts"].items() if n]
    latency = [
        (f"{b['from_ms']:.0f}-{b['to_ms']:.0f} ms", b["count"])
        for b in report["latency"]["histogram"]
    ]
    examples = "".join(
        f"<h3>{escape(cls)}</h3><table class='examples'><tr><th>expected</th>"
        "<th>answered</th></tr>"
        + "".join(
            f"<tr><td colspan='2'>sample {e['sample']} ({escape(e['probe'])}): "
            f"{escape(e['detail'])}</td></tr>"
            f"<tr><td><pre>{escape(e.get('expected', ''))}</pre></td>"
            f"<td><pre>{escape(e['excerpt'])}</pre></td></tr>"
            for e in shown
        )
        + "</table>"
        for cls, shown in report["examples"].items()
    )
    verdict = report["verdict"]
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>Probe report: {escape(verdict)}</title><style>{_CSS}</style></head><body>"
        f"<h1>Corruption probe <span class='badge {escape(verdict)}'>{escape(verdict)}</span></h1>"
        f"<pre>{escape(summary_table(report))}</pre>"
        f"<h2>Running failure rate</h2>{_rate_chart(report)}"
        "<h2>Outcomes</h2>"
        + _bars(classes, "Samples per outcome", "outcome", "class-chart", "#6a51a3")
        + "<h2>Latency</h2>"
        + _bars(
            latency,
            "Latency distribution of judged requests",
            "latency",
            "latency-chart",
            "#31a354",
        )
        + f"<h2>Examples</h2>{examples or '<p>none</p>'}"
        + "<h2>Settings</h2><pre>"
        + escape(json.dumps(report["settings"], indent=2))
        + f"</pre><script>{_CHECK}</script></body></html>"
    )
