"""Fixtures that run real SGLang 0.5.23 pool configurators in a fresh subprocess
(see sglang_pool_harness.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sglang_cases import (
    FLASH_BAD_DTYPE,
    FLASH_BF16,
    FORMULAS,
    MODELS,
    PARITY_CASES,
    PRO_BF16_MTP,
    REFUSED,
    REPEAT,
    UNCHANGED,
    V32_BF16,
    sglang_args,
)

HARNESS = Path(__file__).with_name("sglang_pool_harness.py")


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A directory with a config.json per model: SGLang reads models from a path."""
    dirs = {}
    for name, load in MODELS.items():
        d = tmp_path_factory.mktemp(name)
        (d / "config.json").write_text(json.dumps(load()))
        dirs[name] = str(d)
    return dirs


@pytest.fixture(scope="session")
def run_sglang(model_dirs: dict[str, str]) -> Callable[..., dict[str, dict[str, Any]]]:
    """Run a batch of case descriptions through real SGLang in one fresh process."""

    def run(cases: list[dict[str, Any]], *, plugin: bool = False) -> dict[str, dict[str, Any]]:
        payload = [
            c
            if "index_head_dims" in c
            else {
                "id": c["id"],
                "model_dir": model_dirs[c["model"]],
                "server_args": sglang_args(c),
                "page_size": c.get("page"),
                "available_bytes": c["budget"],
                "index_dtype": c.get("index_dtype", "fp8"),
                "fork_bf16_buffer": c.get("fork_bf16_buffer", False),
            }
            for c in cases
        ]
        env = {**os.environ, "SGLANG_PLUGINS": "dsv4_index_k"}
        argv = [sys.executable, str(HARNESS), *(["--plugin"] if plugin else [])]
        proc = subprocess.run(
            argv, input=json.dumps(payload), capture_output=True, text=True, env=env, timeout=300
        )
        results = {}
        for line in proc.stdout.splitlines():
            if line.startswith("RESULT "):
                result = json.loads(line.removeprefix("RESULT "))
                results[result.pop("id")] = result
        if len(results) != len(cases):
            pytest.fail(
                f"harness returned {len(results)}/{len(cases)} results:\n{proc.stderr[-3000:]}"
            )
        return results

    return run


@pytest.fixture(scope="session")
def sglang_without_plugin(
    run_sglang: Callable[..., dict[str, dict[str, Any]]],
) -> dict[str, dict[str, Any]]:
    """Every case that runs on upstream SGLang, in one process (startup is the slow part)."""
    return run_sglang([*PARITY_CASES, *REFUSED, REPEAT, FORMULAS, FLASH_BF16, V32_BF16])


@pytest.fixture(scope="session")
def sglang_with_plugin(
    run_sglang: Callable[..., dict[str, dict[str, Any]]],
) -> dict[str, dict[str, Any]]:
    """The plugin's cases, in a process that loaded it through SGLang's load_plugins()."""
    return run_sglang(
        [FLASH_BF16, PRO_BF16_MTP, V32_BF16, FLASH_BAD_DTYPE, *UNCHANGED], plugin=True
    )
