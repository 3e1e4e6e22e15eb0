"""Which flags the prefill→decode transfer depends on: declared once, for every flag."""

from __future__ import annotations

import pytest

from dsv4_engine.engine_config import TRANSFER_FORMAT_FLAGS, transfer_flag_in
from dsv4_engine.features import (
    CHANGES_TRANSFER,
    EngineFeatures,
    HiCacheFeature,
    IndexDtype,
    KvCanary,
    transfer_contract,
)
from dsv4_operator.api.rollout import FlagSet


def test_every_flag_declares_what_it_does_to_the_transfer():
    """A new flag cannot slip in undeclared: it must say whether it changes the format."""
    assert set(CHANGES_TRANSFER) == set(EngineFeatures.model_fields)


def flags(image: str = "engine:1", **features) -> FlagSet:
    return FlagSet(features=EngineFeatures(**features), image=image)


def test_the_transfer_revision_moves_with_the_format_and_the_image_only():
    base = flags()
    assert flags(index_dtype=IndexDtype.FP4).transfer_revision != base.transfer_revision
    assert flags(image="engine:2").transfer_revision != base.transfer_revision
    for same in (
        flags(hicache=HiCacheFeature(enabled=True, ratio=2.0)),
        flags(kv_canary=KvCanary.RAISE),
    ):
        assert same.revision != base.revision  # another rollout …
        assert same.transfer_revision == base.transfer_revision  # … the same format
    assert transfer_contract(EngineFeatures()) == {"indexDtype": "fp8"}


@pytest.mark.parametrize("arg", ["--page-size", "--page-size=256", "--kv-cache-dtype", "--page"])
def test_extra_args_that_change_the_transfer_format_are_found_even_abbreviated(arg):
    assert transfer_flag_in(["--mem-fraction-static", "0.8", arg]) == arg
    assert set(TRANSFER_FORMAT_FLAGS) == {"--page-size", "--kv-cache-dtype"}
