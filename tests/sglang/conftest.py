"""Fixtures that run real SGLang 0.5.23 in fresh processes: the pool configurators
(sglang_pool_harness.py), the plugin's hooks and the HiCache gate, each as a child of one
process that imported SGLang (preloaded.py)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from collections.abc import Callable, Iterator
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
PRELOADED = Path(__file__).with_name("preloaded.py")
FreshProcess = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="session")
def fresh_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FreshProcess]:
    """`python SCRIPT ARGS` in a fresh process, but with SGLang already imported: a child
    forked from preloaded.py, with ``env`` (default: this process's), ``input`` on its stdin,
    and its output captured, as subprocess.run gives them back."""
    workdir = tmp_path_factory.mktemp("preloaded")
    server = subprocess.Popen(
        [sys.executable, str(PRELOADED)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a timed-out run is stopped with its whole group
    )
    runs = 0

    def run(
        script: Path, *args: str, input: str = "", env: dict[str, str] | None = None,  # noqa: A002
        timeout: float = 300,
    ) -> subprocess.CompletedProcess[str]:  # fmt: skip
        nonlocal runs
        if server.poll() is not None:  # killed by an earlier run's timeout, or crashed
            raise RuntimeError(f"{PRELOADED.name} is not running (exit {server.returncode})")
        runs += 1
        files = {name: workdir / f"{runs}.{name}" for name in ("stdin", "stdout", "stderr")}
        files["stdin"].write_text(input)
        argv = [str(script), *args]
        request = {k: str(v) for k, v in files.items()}
        request |= {"argv": argv, "env": dict(os.environ if env is None else env)}
        assert server.stdin is not None and server.stdout is not None
        server.stdin.write(json.dumps(request) + "\n")
        server.stdin.flush()
        if not select.select([server.stdout], [], [], timeout)[0]:
            os.killpg(server.pid, 9)
            raise subprocess.TimeoutExpired(argv, timeout)
        answer = server.stdout.readline()
        if not answer:
            raise RuntimeError(f"{PRELOADED.name} exited ({server.wait()}) running {argv}")
        return subprocess.CompletedProcess(
            [sys.executable, *argv],
            json.loads(answer)["returncode"],
            files["stdout"].read_text(),
            files["stderr"].read_text(),
        )

    try:
        yield run
    finally:  # between runs it holds nothing to clean up (an orderly exit took ~3 s)
        os.killpg(server.pid, 9)
        server.wait()


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
def run_sglang(
    model_dirs: dict[str, str], fresh_process: FreshProcess
) -> Callable[..., dict[str, dict[str, Any]]]:
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
        args = ["--plugin"] if plugin else []
        proc = fresh_process(HARNESS, *args, input=json.dumps(payload), env=env)
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
