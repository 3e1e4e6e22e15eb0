"""The real API server refuses each known-bad combination with its id and link, accepts it
acknowledged, and agrees with the operator's model on every case: the CRD's CEL rules and
the model's check are both generated from one registry (dsv4_operator.api.known_issues)."""

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from dsv4_operator.api.errors import first_error
from dsv4_operator.api.known_issues import PINNED
from dsv4_operator.api.samples import SHIPPED_DIR, load_sample, merge_patch, shipped_sample
from dsv4_operator.api.spec import DSV4DeploymentSpec
from tests.e2e.helpers import dry_run_in_default

CASES = yaml.safe_load((Path(__file__).parents[1] / "data" / "known_issue_cases.yaml").read_text())
LINKS = {issue.id: issue.link for issue in PINNED}
# Each case as written, and each refused case again with its entry acknowledged.
VARIANTS = [(case, None) for case in CASES] + [
    (case, [case["refused"]]) for case in CASES if case["refused"]
]


def model_refusal(spec: dict) -> str | None:
    try:
        DSV4DeploymentSpec.model_validate(spec)
    except ValidationError as err:
        return first_error(err)
    return None


@pytest.mark.parametrize(
    ("case", "acknowledged"),
    VARIANTS,
    ids=[c["name"] + ("-acknowledged" if a else "") for c, a in VARIANTS],
)
def test_the_api_server_and_the_model_give_the_same_verdict(crd, case, acknowledged):
    patch = dict(case["patch"])
    if acknowledged:
        patch["acknowledgedKnownIssues"] = acknowledged
    obj = merge_patch(load_sample(), {"metadata": {"name": "known"}, "spec": patch})
    server = dry_run_in_default(crd, obj)
    model = model_refusal(obj["spec"])
    if case["refused"] and not acknowledged:
        assert server.returncode != 0, f"the API server accepted {patch}"
        for text in (server.stderr, model or ""):
            assert case["field"] in text and case["refused"] in text, text
            assert LINKS[case["refused"]] in text, text
            assert "spec.acknowledgedKnownIssues" in text, text
    else:
        assert server.returncode == 0, server.stderr
        assert model is None, model


SAMPLES = sorted(p.stem for p in SHIPPED_DIR.glob("*.yaml") if p.name != "kustomization.yaml")


@pytest.mark.parametrize("name", SAMPLES)
def test_the_shipped_samples_are_accepted(crd, name):
    result = dry_run_in_default(crd, shipped_sample(name))
    assert result.returncode == 0, result.stderr
