"""Bad `dsv4-engine serve` flags end the process before it serves, with one clear line."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys

import pytest

from dsv4_engine.commands.serve import add_serve_arguments, settings_from_args
from dsv4_engine.features import HiCacheFeature
from dsv4_engine.reference.settings import ServeSettings

pytestmark = pytest.mark.slow  # one Python process per case


def serve(*flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run(
        [sys.executable, "-m", "dsv4_engine.cli", "serve", *flags],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (("--index-dtype", "int3"), "--index-dtype 'int3': expected one of fp8 | bf16 | fp4"),
        (("--enable-hierarchical-cache", "--hicache-ratio", "1"), "--hicache-ratio 1.0"),
        (("--enable-hierarchical-cache", "--hicache-size", "-1"), "--hicache-size -1"),
        (("--tp", "2"), "--tp 2: the CPU reference engine runs only --tp 1"),
        (("--page-size", "64"), "--page-size 64"),
        (("--disaggregation-mode", "both"), "--disaggregation-mode 'both'"),
        (("--hicache-layer-latency", "-1"), "--hicache-layer-latency -1.0: expected ms >= 0"),
        (
            ("--benign-nondeterminism", "1"),
            "--benign-nondeterminism 1.0: expected a share in [0, 1)",
        ),
        (
            ("--benign-nondeterminism", "0.1", "--reference-model", "echo"),
            "--benign-nondeterminism: the echo model copies its tokens",
        ),
    ],
)
def test_bad_flag_exits_with_one_line(flags, expected):
    result = serve(*flags)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], result.stderr


def test_port_in_use_exits_with_one_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = serve("--port", str(port))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"dsv4-engine serve: error: --port {port}: address 127.0.0.1:{port} is already in use"
    )


@pytest.mark.parametrize("value", ["yes", "1.5"])
def test_bad_injection_variable_is_refused(value):
    result = serve(env={"DSV4_INJECT_UNGATED_INDEX_K": value})
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"dsv4-engine serve: error: DSV4_INJECT_UNGATED_INDEX_K={value!r}: "
        "expected 0, 1 or a share of loads in between"
    )


def parsed(*flags: str) -> ServeSettings:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return settings_from_args(parser.parse_args(list(flags)))


def test_hicache_without_a_ratio_takes_sglangs_default():
    settings = parsed("--enable-hicache")  # SGLang's alias too
    assert settings.hicache_feature == HiCacheFeature(enabled=True, ratio=2.0)
    sized = parsed("--enable-hierarchical-cache", "--hicache-size", "64")
    assert sized.hicache_feature == HiCacheFeature(enabled=True, size_gb=64)


def test_unset_flags_leave_the_engine_its_own_choice():
    assert parsed() == ServeSettings()
    assert parsed("--model-path", "/models/flash").served_model_name == "/models/flash"
    named = parsed("--model-path", "/m", "--served-model-name", "flash")
    assert named.served_model_name == "flash" and named.model_path == "/m"
