"""What the operator renders for each shipped sample, as the install's checks read it
(kube-score: test_kube_score.py; Pod Security levels: tests/e2e/test_pod_security.py):
`dsv4ctl render SAMPLE --canary indexDtype=fp4 --probe-job`, through its render function,
with the probe Job on the operator's own image."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml

from dsv4_operator.api.samples import SHIPPED_DIR
from dsv4_operator.cli.render import render

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = sorted(SHIPPED_DIR.glob("*-*.yaml"))
WORKLOADS = ("StatefulSet", "Deployment", "Job")
LWS_TEMPLATES = ("leaderTemplate", "workerTemplate")


def operator_image() -> str:
    """The probe Job's image: the operator's own, as the installed operator finds it."""
    (deployment,) = yaml.safe_load_all((ROOT / "manifests/base/deployment.yaml").read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container["image"]


@functools.cache
def _rendered(sample: Path) -> str:
    doc = yaml.safe_load(sample.read_text())
    return yaml.safe_dump_all(render(doc, None, ["indexDtype=fp4"], True, operator_image()))


def rendered(sample: Path) -> list[dict[str, Any]]:
    """Every object for ``sample``: its children, a canary's, the canary's first probe Job."""
    return list(yaml.safe_load_all(_rendered(sample)))


def pod_templates(objects: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, pod template) of every workload, both templates of a LeaderWorkerSet."""
    out = [(o, o["spec"]["template"]) for o in objects if o["kind"] in WORKLOADS]
    for o in objects:
        if o["kind"] == "LeaderWorkerSet":
            group = o["spec"]["leaderWorkerTemplate"]
            out += [(o, group[t]) for t in LWS_TEMPLATES if t in group]
    return out
