"""`dsv4-engine serve` takes SGLang 0.5.23's default for every flag it shares with SGLang,
read from SGLang's own parser and resolution hooks (real import, no copy)."""

from __future__ import annotations

import argparse

import pytest

from dsv4_engine.commands.serve import add_serve_arguments, settings_from_args
from dsv4_engine.reference.settings import ServeSettings

pytestmark = pytest.mark.sglang

# The flags `serve` shares with SGLang; the test fails if one goes missing on either side.
MIRRORED = {
    "--host", "--port", "--model-path", "--served-model-name", "--tp-size", "--page-size",
    "--enable-hierarchical-cache", "--enable-hicache", "--hicache-ratio", "--hicache-size",
    "--hicache-write-policy", "--hicache-mem-layout", "--max-running-requests",
    "--max-total-tokens", "--context-length", "--random-seed", "--disaggregation-mode",
    "--disaggregation-bootstrap-port", "--log-level", "--kv-canary",
}  # fmt: skip


@pytest.fixture(scope="module")
def sglang_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser


@pytest.fixture(scope="module")
def serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser


def test_every_shared_flag_has_sglangs_default(sglang_parser, serve_parser):
    ours, theirs = serve_parser._option_string_actions, sglang_parser._option_string_actions
    shared = {flag for flag in ours if flag in theirs and flag not in ("-h", "--help")}
    assert shared == MIRRORED
    for flag in sorted(shared):
        mine = serve_parser.get_default(ours[flag].dest)
        sglang = sglang_parser.get_default(theirs[flag].dest)
        assert mine == sglang, f"{flag}: serve defaults to {mine!r}, SGLang to {sglang!r}"
        if ours[flag].choices is not None:
            assert list(ours[flag].choices) == list(theirs[flag].choices), flag


def resolved(sglang_parser: argparse.ArgumentParser, hook, field: str, *argv: str):
    """What SGLang's own start-up hook makes of a flag left unset."""
    from sglang.srt.arg_groups.overrides import resolution_result
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs.from_cli_args(sglang_parser.parse_args(list(argv)))
    args._input_frozen = True  # as `resolve_once` sets it around the hooks
    hook(args)
    return resolution_result(args, field)


def test_a_flag_sglang_resolves_when_unset_resolves_alike(sglang_parser, serve_parser):
    from sglang.srt.arg_groups.hicache_hook import handle_hicache_ratio_default
    from sglang.srt.arg_groups.serving_hook import handle_missing_default_values

    hicache = ("--model-path", "/models/flash", "--enable-hierarchical-cache")
    ratio = resolved(sglang_parser, handle_hicache_ratio_default, "hicache_ratio", *hicache)
    ours = settings_from_args(serve_parser.parse_args(list(hicache)))
    assert ratio == ours.hicache_ratio == 2.0
    assert ours.hicache_feature is not None and ours.hicache_feature.ratio == ratio

    # (--device named: the hook would otherwise look for an accelerator this machine lacks)
    model = ("--model-path", "/models/flash")
    device = ("--device", "cuda")
    hook = handle_missing_default_values
    name = resolved(sglang_parser, hook, "served_model_name", *model, *device)
    assert name == settings_from_args(serve_parser.parse_args(list(model))).served_model_name


def test_what_sglang_leaves_to_the_engine_is_the_reference_models_choice(serve_parser):
    """SGLang sizes these from the model and the GPU at start-up; the reference engine from
    its own model: unset flags give exactly its defaults."""
    settings = settings_from_args(serve_parser.parse_args([]))
    assert settings == ServeSettings()
    for field in ("page_size", "max_running_requests", "max_total_tokens", "context_length"):
        assert getattr(settings, field) > 0
