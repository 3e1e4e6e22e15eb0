"""The real API server refuses invalid DSV4Deployments, naming the field (CRD schema + CEL)."""

from pathlib import Path

import pytest
import yaml

from dsv4_engine.probe.stats import minimum_samples
from dsv4_operator.api.names import MULTINODE_MAX, SINGLE_NODE_MAX
from dsv4_operator.api.samples import load_sample, merge_patch
from tests.e2e.helpers import dry_run_in_default

pytestmark = pytest.mark.e2e

INVALID = yaml.safe_load(
    (Path(__file__).parents[1] / "data" / "invalid_dsv4_specs.yaml").read_text()
)


def test_the_sample_is_accepted(crd):
    result = dry_run_in_default(crd, load_sample())
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("case", INVALID, ids=[c["name"] for c in INVALID])
def test_invalid_spec_is_refused_naming_the_field(crd, case):
    name = f"bad-{case['name']}"[:63]
    obj = merge_patch(load_sample(), {"metadata": {"name": name}, "spec": case["patch"]})
    result = dry_run_in_default(crd, obj)
    assert result.returncode != 0, f"accepted: {case['patch']}"
    assert case["field"] in result.stderr, result.stderr


# (maxCorruptionRate, confidence): the defaults, a tight and a loose budget, high confidence.
SETTINGS = [(0.005, 0.95), (0.001, 0.99), (0.1, 0.95), (0.02, 0.999), (0.3, 0.6)]


@pytest.mark.parametrize(("rate", "confidence"), SETTINGS)
def test_the_api_server_and_the_probe_agree_on_the_fewest_requests_that_can_pass(
    crd, rate, confidence
):
    """At the minimum the API server accepts, one below it refuses naming the field and the
    minimum — the very number `dsv4ctl probe` and the canary use (`minimum_samples`)."""
    least = minimum_samples(rate, confidence)
    canary = {"maxCorruptionRate": rate, "confidence": confidence}

    def with_requests(n: int | None) -> dict:
        settings = canary if n is None else {**canary, "requests": n}
        return merge_patch(
            load_sample(), {"metadata": {"name": "grid"}, "spec": {"canary": settings}}
        )

    assert dry_run_in_default(crd, with_requests(least)).returncode == 0
    assert dry_run_in_default(crd, with_requests(None)).returncode == 0  # unset: the minimum
    refused = dry_run_in_default(crd, with_requests(least - 1))
    assert refused.returncode != 0
    assert "spec.canary.requests" in refused.stderr
    assert f"{least - 1} requests can never PASS" in refused.stderr
    assert f"the minimum is {least}" in refused.stderr


def test_a_setting_no_request_count_can_pass_is_refused_even_unset(crd):
    obj = merge_patch(
        load_sample(),
        {"metadata": {"name": "hopeless"}, "spec": {"canary": {"maxCorruptionRate": 1e-5}}},
    )
    refused = dry_run_in_default(crd, obj)
    assert refused.returncode != 0
    assert "the default requests can never PASS" in refused.stderr
    assert "the minimum is more than 100000" in refused.stderr


@pytest.mark.parametrize(("name", "accepted"), [("flash-canary", True), ("flash--canary", False)])
def test_a_name_with_a_double_hyphen_is_refused(crd, name, accepted):
    """`<name>--canary-…` is the canary slice's: no deployment may be named into it."""
    result = dry_run_in_default(crd, merge_patch(load_sample(), {"metadata": {"name": name}}))
    assert (result.returncode == 0) is accepted, result.stderr
    if not accepted:
        assert "metadata.name: must not contain '--'" in result.stderr


MULTINODE = {"decode": {"nodesPerReplica": 2, "tp": 8}}


@pytest.mark.parametrize(
    ("length", "spec", "refusal"),
    [
        (SINGLE_NODE_MAX, {}, None),
        (SINGLE_NODE_MAX + 1, {}, f"metadata.name: at most {SINGLE_NODE_MAX} characters"),
        (MULTINODE_MAX, MULTINODE, None),
        (
            MULTINODE_MAX + 1,
            MULTINODE,
            f"metadata.name: at most {MULTINODE_MAX} characters when a role has "
            "nodesPerReplica > 1",
        ),
    ],
)
def test_a_name_at_its_budget_is_accepted_and_one_past_it_refused(crd, length, spec, refusal):
    """The budget the operator computes (api/names.py) is the API server's."""
    obj = merge_patch(load_sample(), {"metadata": {"name": "n" * length}, "spec": spec})
    result = dry_run_in_default(crd, obj)
    assert (result.returncode == 0) is (refusal is None), result.stderr
    if refusal is not None:
        assert refusal in result.stderr


@pytest.mark.parametrize("name", ["1flash", "flash.v2"])  # valid names of a CRD object
def test_a_name_that_cannot_name_a_service_is_refused(crd, name):
    result = dry_run_in_default(crd, merge_patch(load_sample(), {"metadata": {"name": name}}))
    assert result.returncode != 0
    assert "metadata.name: must start with a lowercase letter" in result.stderr
