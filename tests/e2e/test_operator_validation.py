"""The real API server refuses invalid DSV4Deployments, naming the field (CRD schema + CEL)."""

import json
from pathlib import Path

import pytest
import yaml

from dsv4_operator.api.crd import CRD_PATH
from dsv4_operator.api.samples import load_sample, merge_patch

pytestmark = pytest.mark.e2e

INVALID = yaml.safe_load(
    (Path(__file__).parents[1] / "data" / "invalid_dsv4_specs.yaml").read_text()
)


@pytest.fixture(scope="module")
def crd(cluster):
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_PATH))
    cluster.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s",
        "crd/dsv4deployments.inference.dsv4.dev",
    )  # fmt: skip
    return cluster


def dry_run(cluster, obj):
    return cluster.kubectl(
        "apply", "--dry-run=server", "-n", "default", "-f", "-", check=False, input=json.dumps(obj)
    )


def test_the_sample_is_accepted(crd):
    result = dry_run(crd, load_sample())
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("case", INVALID, ids=[c["name"] for c in INVALID])
def test_invalid_spec_is_refused_naming_the_field(crd, case):
    name = f"bad-{case['name']}"[:63]
    obj = merge_patch(load_sample(), {"metadata": {"name": name}, "spec": case["patch"]})
    result = dry_run(crd, obj)
    assert result.returncode != 0, f"accepted: {case['patch']}"
    assert case["field"] in result.stderr, result.stderr
