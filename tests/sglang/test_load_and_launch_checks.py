"""What the engine image checks at build (`load_check`) and in a pod without a GPU
(`dsv4-engine launch --check`), on the pinned SGLang, each in a fresh process as SGLang's
plugin loading is process-wide."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dsv4_engine import cli
from dsv4_engine.engine_config import EngineConfig, dump_engine_yaml
from dsv4_engine.features import Role
from dsv4_engine.sglang_plugin import AFTER_HOOKS, HOOKS, load_check

pytestmark = pytest.mark.sglang

ACCEPTED = "# accepted by SGLang 0.5.23's load_plugins(), parser and ServerArgs; not started"


def test_load_check_passes_when_sglang_applies_every_hook(fresh_process: Callable) -> None:
    proc = fresh_process(Path(load_check.__file__))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[-1] == (
        "load check: SGLang 0.5.23's load_plugins() loaded dsv4_index_k and applied its 7 "
        "hooks and its kv-canary counter"
    )


def test_load_check_fails_naming_each_hook_sglang_did_not_apply(
    fresh_process: Callable, tmp_path: Path
) -> None:
    """SGLang's HookRegistry swallows a hook it cannot apply (here: it applies none) and the
    engine would start without it; the check fails the build instead."""
    script = tmp_path / "no_hooks.py"
    script.write_text(
        "import sys\n"
        "from sglang.srt.plugins.hook_registry import HookRegistry\n"
        "HookRegistry.apply_hooks = classmethod(lambda cls: None)\n"
        "from dsv4_engine.sglang_plugin.load_check import main\n"
        "sys.exit(main())\n"
    )
    proc = fresh_process(script)
    assert proc.returncode == 1
    failed = [line for line in proc.stdout.splitlines() if line.startswith("FAIL")]
    assert failed == [
        f"FAIL not installed: hook {hook.__name__} on {target}"
        for target, hook in (*HOOKS, *AFTER_HOOKS)
    ]


def engine_yaml(tmp_path: Path, **kw: object) -> Path:
    config = EngineConfig(
        role=Role.PREFILL, model_path="/models", served_model_name="m", tp=8, ep=8, **kw
    )
    path = tmp_path / "engine.yaml"
    path.write_text(dump_engine_yaml(config))
    return path


def test_launch_check_gets_sglangs_parser_and_server_args_to_accept_the_command(
    fresh_process: Callable, tmp_path: Path
) -> None:
    path = engine_yaml(tmp_path)
    proc = fresh_process(Path(cli.__file__), "launch", "--config", str(path), "--check")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[-1] == ACCEPTED


def test_launch_check_fails_where_sglangs_parser_refuses_the_command(
    fresh_process: Callable, tmp_path: Path
) -> None:
    """An extra argument of the wrong type: SGLang's own usage error, exit 2."""
    path = engine_yaml(tmp_path, extra_args=("--mem-fraction-static", "most"))
    proc = fresh_process(Path(cli.__file__), "launch", "--config", str(path), "--check")
    assert proc.returncode == 2
    assert "sglang serve: error: argument --mem-fraction-static" in proc.stderr
    assert ACCEPTED not in proc.stdout
