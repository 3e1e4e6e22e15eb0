"""The wire-format key's inputs against SGLang 0.5.23's own code (real imports): every flag
it reads exists in SGLang's parser, every environment variable in SGLang's environment
registry, and SGLang's P/D handshake compares what the key claims it does."""

from __future__ import annotations

import argparse
import inspect

import pytest

from dsv4_engine.wire import WIRE_ENV, WIRE_FLAG_PREFIX, WIRE_FLAGS, wire_args

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def options():
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return {o for action in parser._actions for o in action.option_strings}


def test_every_wire_flag_is_an_sglang_server_argument(options):
    assert set(WIRE_FLAGS) <= options
    assert {o for o in options if o.startswith(WIRE_FLAG_PREFIX)}, "speculative flags exist"


def test_every_wire_environment_variable_is_one_sglang_reads():
    from sglang.srt.environ import envs

    for name in WIRE_ENV:
        assert hasattr(envs, name), name


def test_the_handshake_compares_page_size_kv_dtype_and_the_kv_layout():
    """What SGLang checks itself (and the key covers, among more)."""
    from sglang.srt.disaggregation.common.conn import CommonKVManager

    source = inspect.getsource(CommonKVManager.try_ensure_parallel_info)
    for compared in ("page_size", "kv_cache_dtype", "kv_layout", "dsv41_spec_layout"):
        assert f"info.{compared}" in source, compared


def test_every_speculative_argument_counts_in_the_key(options):
    speculative = sorted(o for o in options if o.startswith(WIRE_FLAG_PREFIX))
    for flag in speculative:
        assert wire_args([flag, "1"]) == [f"{flag}=1"], flag
    assert wire_args(["--mem-fraction-static", "0.8"]) == []
