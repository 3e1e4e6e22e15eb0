"""The shipped PrometheusRule is valid for Prometheus and fires when it should (promtool)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dsv4_dev.monitoring import config
from dsv4_operator import metrics

ROOT = Path(__file__).resolve().parents[3]
RULE = ROOT / "manifests" / "monitoring" / "prometheusrule.yaml"
UNIT_TESTS = ROOT / "tests" / "promtool" / "rules_test.yaml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool missing: `make system-deps` installs Debian's prometheus"
)


@pytest.fixture()
def rules_file(tmp_path: Path) -> Path:
    """promtool reads plain rule files: the PrometheusRule's spec is exactly one."""
    spec = yaml.safe_load(RULE.read_text())["spec"]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(spec))
    shutil.copy(UNIT_TESTS, tmp_path / "rules_test.yaml")
    return path


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, check=False)


@needs_promtool
def test_promtool_check_rules(rules_file: Path):
    result = promtool("check", "rules", str(rules_file), cwd=rules_file.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 17 rules found" in result.stdout


@needs_promtool
def test_promtool_unit_tests(rules_file: Path):
    result = promtool("test", "rules", "rules_test.yaml", cwd=rules_file.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_rules_name_only_metrics_the_operator_exports():
    """A metric renamed in metrics.py without the rule being updated would never fire."""
    families = list(metrics.REGISTRY.collect())
    exported = {m.name for m in families} | {
        f"{m.name}_total" for m in families if m.type == "counter"
    }
    used = set().union(*config.rule_metrics().values())
    operator = {name for name in used if name.startswith("dsv4_operator_")}
    assert operator, "the rules reference the operator's metrics"
    assert operator <= exported, f"not exported: {sorted(operator - exported)}"


def family(name: str) -> str:
    """A series name's metric family: a counter's `_total` and a histogram's `_bucket` off."""
    return re.sub(r"_(total|bucket)$", "", name)


@pytest.mark.sglang
def test_rules_name_only_metrics_the_engines_and_sglang_serve():
    """The engines' series a rule reads are SGLang 0.5.23's own (named in its metrics
    collector) or this project's engine counters (named in engine/dsv4_engine); `up` is
    Prometheus's own."""
    import sglang.srt.observability.metrics_collector as collector

    sglang_names = set(
        re.findall(r'name="(sglang:[a-z_:]+)"', Path(collector.__file__).read_text())
    )
    engine_source = "\n".join(
        p.read_text() for p in (ROOT / "engine" / "dsv4_engine").rglob("*.py")
    )
    used = set().union(*config.rule_metrics().values()) - {"up"}
    engines = {name for name in used if not name.startswith("dsv4_operator_")}
    assert {n for n in engines if n.startswith("sglang:")}, "the rules read SGLang's metrics"
    unknown = {
        name
        for name in engines
        if family(name) not in sglang_names and f'"{family(name)}' not in engine_source
    }
    assert not unknown, f"no engine serves: {sorted(unknown)}"


def anchor(heading: str) -> str:
    """A Markdown heading's anchor, as GitHub makes it: lower case, punctuation dropped,
    spaces to hyphens."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def test_every_alert_has_a_runbook_url_whose_page_and_section_exist():
    spec = yaml.safe_load(RULE.read_text())["spec"]
    alerts = [r for g in spec["groups"] for r in g["rules"] if "alert" in r]
    for alert in alerts:
        url = alert["annotations"].get("runbook_url")
        assert url, f"{alert['alert']} has no runbook_url"
        path, _, section = url.partition("#")
        page = ROOT / path
        assert page.is_file(), f"{alert['alert']}: {path} does not exist"
        headings = re.findall(r"^#+ (.+)$", page.read_text(), re.MULTILINE)
        assert section in {anchor(h) for h in headings}, f"{alert['alert']}: no section #{section}"
