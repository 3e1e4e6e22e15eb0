"""The shipped PrometheusRule is valid for Prometheus and fires when it should (promtool)."""

from __future__ import annotations

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
    assert "SUCCESS: 6 rules found" in result.stdout


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
    used = set().union(*config.rule_metrics().values()) - {"up"}  # up: Prometheus's own
    assert used, "the rules reference the operator's metrics"
    assert used <= exported, f"not exported: {sorted(used - exported)}"
