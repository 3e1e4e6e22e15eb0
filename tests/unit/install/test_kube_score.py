"""kube-score (hack/build-kube-score.sh) on everything the operator renders for each shipped
sample: its children, a canary's and a probe Job's (`dsv4ctl render`, `rendered.py`).  A
critical finding fails the test unless docs/install.md's table "What kube-score still
reports" lists its check for that component with the reason it is accepted; a row no
finding needs any more fails it too, so the table stays what kube-score says.

kube-score reads Deployments, StatefulSets and Jobs, not LeaderWorkerSets: the multi-node
sample's engine pods are scored through the single-node samples' StatefulSets, whose pod
template is the same (`render.workloads._pod_template`).
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from dsv4_dev.cluster.binaries import kube_score
from dsv4_operator.render.meta import LABEL_COMPONENT
from tests.unit.install.rendered import ROOT, SAMPLES, rendered

CRITICAL = 1  # kube-score's grade for a critical finding (warnings are 5)
KUBERNETES = "v1.30"  # the oldest the install supports (docs/install.md)
TABLE = "### What kube-score still reports"


def accepted() -> dict[tuple[str, str], str]:
    """(check id, component) → why, from docs/install.md's table."""
    text = (ROOT / "docs" / "install.md").read_text()
    section = text.split(TABLE, 1)[1].split("\n#", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        check, components, why = cells
        for component in re.findall(r"`([\w-]+)`", components):
            rows[(check.strip("`"), component)] = why
    assert rows, f"no rows under {TABLE!r} in docs/install.md"
    return rows


@functools.cache
def critical_findings(sample: Path) -> frozenset[tuple[str, str, str]]:
    """(check id, component, object) of each critical finding on what ``sample`` renders."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"{sample.stem}.yaml"
        path.write_text(yaml.safe_dump_all(rendered(sample)))
        result = subprocess.run(
            [str(kube_score()), "score", str(path), "--output-format", "json",
             "--kubernetes-version", KUBERNETES],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    assert result.returncode in (0, 1), result.stderr  # 1: it found something
    found = set()
    for obj in json.loads(result.stdout):
        labels = (obj.get("object_meta") or {}).get("labels") or {}
        for check in obj["checks"]:
            if check["grade"] == CRITICAL and not check["skipped"]:
                found.add(
                    (check["check"]["id"], labels.get(LABEL_COMPONENT, ""), obj["object_name"])
                )
    return frozenset(found)


@pytest.mark.parametrize("sample", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_every_critical_finding_on_a_rendered_sample_is_explained(sample):
    reasons = accepted()
    unexplained = sorted(f for f in critical_findings(sample) if f[:2] not in reasons)
    assert unexplained == [], (
        f"kube-score's critical findings on {sample.name} that docs/install.md ({TABLE!r}) does "
        f"not explain: fix the render, or add the check and component with why: {unexplained}"
    )


def test_every_explained_finding_still_occurs():
    reasons = accepted()
    seen = {f[:2] for sample in SAMPLES for f in critical_findings(sample)}
    assert sorted(set(reasons) - seen) == [], "rows kube-score no longer needs: remove them"
