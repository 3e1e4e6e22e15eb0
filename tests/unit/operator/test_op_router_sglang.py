"""The rendered router arguments against sglang-router's own parser (real import)."""

import argparse

import pytest

from dsv4_operator.api.samples import load_sample, merge_patch
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.render.meta import Owner, Slot
from dsv4_operator.render.router import ROUTER_PORT, router_args
from dsv4_operator.render.workloads import BOOTSTRAP_PORT_ANNOTATION

pytestmark = pytest.mark.sglang


def test_router_args_parse_to_pd_mode_with_label_discovery():
    from sglang_router.router_args import RouterArgs

    parser = argparse.ArgumentParser(exit_on_error=False)
    RouterArgs.add_cli_args(parser)
    spec = DSV4DeploymentSpec.model_validate(
        merge_patch(load_sample()["spec"], {"router": {"policy": "power_of_two"}})
    )
    args = router_args(Owner("flash", "ns", "u"), spec, Slot.GREEN, "0123456789")
    parsed = RouterArgs.from_cli_args(parser.parse_args(args))
    assert parsed.pd_disaggregation and parsed.service_discovery
    assert parsed.policy == "power_of_two"
    assert (parsed.host, parsed.port) == ("0.0.0.0", ROUTER_PORT)
    assert parsed.service_discovery_namespace == "ns" and parsed.service_discovery_port == 30000
    for role, selector in (
        ("prefill", parsed.prefill_selector),
        ("decode", parsed.decode_selector),
    ):
        assert selector["app.kubernetes.io/instance"] == "flash"
        assert selector["app.kubernetes.io/component"] == role
        assert selector["inference.dsv4.dev/group-role"] == "leader"
        # Only its own slot's engines of its own transfer format: never a mixed pair.
        assert selector["inference.dsv4.dev/slot"] == "green"
        assert selector["inference.dsv4.dev/transfer-revision"] == "0123456789"
    # The prefill pods' bootstrap port is read from the annotation the engine pods carry.
    assert parsed.bootstrap_port_annotation == BOOTSTRAP_PORT_ANNOTATION
