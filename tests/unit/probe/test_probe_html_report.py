"""The HTML report opens in a real headless browser (Debian's chromium) and lays out its
three charts; it references nothing outside the page."""

import asyncio
import html
import re
import shutil
import subprocess

import pytest

from dsv4_engine.probe import ProbeName, ProbeSettings, build_report, run_probes
from dsv4_engine.probe.html_report import render_html
from dsv4_engine.probe.scripted_server import ScriptedCompletionServer

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


async def _report() -> dict:
    server = ScriptedCompletionServer(corruption_rate=0.03, latency_s=0.002, seed=8)
    url = await server.start()
    try:
        settings = ProbeSettings(
            base_url=url,
            probes=(ProbeName.TOOLCALL_ECHO,),
            concurrency=8,
            requests=300,
            max_corruption_rate=0.01,
        )
        return build_report(await run_probes(settings))
    finally:
        await server.stop()


def test_html_report_renders_in_headless_chromium(tmp_path):
    if not shutil.which(CHROMIUM):
        pytest.fail("chromium is missing: run hack/system-deps.sh")
    report = asyncio.run(_report())
    page = render_html(report)
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", page), "external asset"
    path = tmp_path / "report.html"
    path.write_text(page)
    dom = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--dump-dom",
            path.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert 'data-rendered="yes"' in dom, dom[-2000:]
    for chart in ("rate-chart", "class-chart", "latency-chart"):
        assert f'id="{chart}"' in dom
    assert f"threshold {report['threshold']:.2%}" in dom
    assert report["verdict"] in dom
    # Each damaged answer sits in one table row beside the clean answer it should have been
    # (an HTML parser drops the newline that opens a <pre>).
    rows = re.findall(r"<tr><td><pre>(.*?)</pre></td><td><pre>(.*?)</pre></td></tr>", dom, re.S)
    shown = {(html.unescape(a), html.unescape(b)) for a, b in rows}
    for example in report["examples"]["ARG_CORRUPTION"]:
        pair = (example["expected"].removeprefix("\n"), example["excerpt"].removeprefix("\n"))
        assert pair in shown
