"""The typed spec: defaults, and the same invalid specs the API server refuses."""

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from dsv4_engine.features import IndexDtype, KvCanary
from dsv4_operator.api.errors import first_error
from dsv4_operator.api.samples import load_sample, merge_patch
from dsv4_operator.api.spec import DEFAULT_GPU_PRODUCTS, DSV4DeploymentSpec, RoleSpec

INVALID = yaml.safe_load(
    (Path(__file__).parents[2] / "data" / "invalid_dsv4_specs.yaml").read_text()
)


def test_sample_parses_with_defaults():
    spec = DSV4DeploymentSpec.model_validate(load_sample()["spec"])
    assert spec.prefill.tp == 4 and spec.decode.gpus_per_node == 4
    assert spec.model.tool_call_parser == "deepseekv4"
    assert spec.features.index_dtype is IndexDtype.FP8
    assert spec.features.kv_canary is KvCanary.LOG
    assert spec.router.replicas == 1
    assert (
        DSV4DeploymentSpec.model_validate(
            merge_patch(load_sample()["spec"], {"placement": None})
        ).placement.gpu_products
        == DEFAULT_GPU_PRODUCTS
    )


def test_the_invalid_table_has_at_least_eight_distinct_fields():
    assert len({case["field"] for case in INVALID}) >= 8


@pytest.mark.parametrize("case", INVALID, ids=[c["name"] for c in INVALID])
def test_operator_refuses_invalid_spec_naming_the_field(case):
    spec = merge_patch(load_sample()["spec"], case["patch"])
    with pytest.raises(ValidationError) as err:
        DSV4DeploymentSpec.model_validate(spec)
    message = first_error(err.value)
    parent, _, leaf = case["field"].rpartition(".")
    # The location is the field itself, or the parent with the leaf named in the text, or
    # the text names the field's whole path (a rule across sections of the spec).
    assert (
        message.startswith(case["field"])
        or (message.startswith(parent) and leaf in message)
        or case["field"].removeprefix("spec.") in message
    ), message


@pytest.mark.parametrize(
    "args",
    [
        ["--enable-metrics-for-all-schedulers"],
        ["--hicache-io-backend", "direct"],
        ["--mem-fraction-static=0.8"],
    ],
)
def test_extra_args_that_do_not_touch_owned_flags_are_accepted(args):
    assert RoleSpec(extra_args=args).extra_args == tuple(args)
