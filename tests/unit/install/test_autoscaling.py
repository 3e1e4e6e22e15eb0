"""The shipped decode HPA (manifests/autoscaling/) targets what the CRD's scale subresource
scales — decode, and only decode — and reads a metric SGLang 0.5.23 really exports.  (Its
server-side dry run and a `kubectl scale` through the subresource are in
tests/e2e/test_lws.py.)"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import yaml

from dsv4_operator.api import API_VERSION, KIND
from dsv4_operator.api.crd import build_crd
from dsv4_operator.api.samples import shipped_sample

ROOT = Path(__file__).resolve().parents[3]
HPA = ROOT / "manifests" / "autoscaling" / "pro-decode-hpa.yaml"


def test_the_hpa_scales_the_pro_samples_decode_through_the_scale_subresource():
    hpa = yaml.safe_load(HPA.read_text())
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"]) == (API_VERSION, KIND)
    assert target["name"] == shipped_sample("pro-gb200-nvl72")["metadata"]["name"]
    scale = build_crd()["spec"]["versions"][0]["subresources"]["scale"]
    assert scale == {
        "specReplicasPath": ".spec.decode.replicas",
        "statusReplicasPath": ".status.decode.ready",
        "labelSelectorPath": ".status.decode.selector",
    }


@pytest.mark.sglang
def test_the_metric_behind_it_is_sglangs_own_running_requests_gauge():
    """Named in SGLang's real scheduler metrics collector (read from the pinned source)."""
    from sglang.srt.observability.metrics_collector import SchedulerMetricsCollector

    source = inspect.getsource(SchedulerMetricsCollector.__init__)
    assert 'name="sglang:num_running_reqs"' in source
    metric = yaml.safe_load(HPA.read_text())["spec"]["metrics"][0]["pods"]["metric"]["name"]
    # A custom metrics adapter serves it under a name without ':' (the rule in the file).
    assert metric == "sglang:num_running_reqs".replace(":", "_")
    assert 'matches: "sglang:num_running_reqs"' in HPA.read_text()
