"""`dsv4-engine launch --config engine.yaml`: the engine image's entrypoint.

Reads the configuration the operator renders (`dsv4_engine.engine_config`), validates it
and replaces itself (exec) with the engine: real SGLang with this project's plugin, or
with `backend: reference` the CPU reference engine.  A multi-node pod finds its node rank
and its leader from the environment LeaderWorkerSet gives every pod of a group.

`--check` proves a command without a GPU: the engine's own parser takes it, as far as the
engine goes before it reads the model and the device (for SGLang, what
`sglang.launch_server` does first: `load_plugins()`, then `prepare_server_args`, its
parser and `ServerArgs`; resolving them reads the checkpoint and the GPUs, so that is left
to a GPU node).  Without one, SGLang is not started: it would end in a traceback deep in its
start, so the launcher names the missing device instead.
"""

from __future__ import annotations

import argparse
import glob
import os
import shlex
import sys
from pathlib import Path

import yaml
from pydantic import ValidationError

from dsv4_engine.cliutil import CommandError, OneLineParser
from dsv4_engine.engine_config import (
    CANARY_ARG,
    PLUGINS_ENV,
    UNGATED_INDEX_K_ENV,
    Backend,
    EngineConfig,
    load_engine_yaml,
    place_pod,
    plugin_env,
    to_sglang_args,
)
from dsv4_engine.index_k import sglang_index_dtype_error

PLUGIN_ENTRY_POINT = "dsv4_index_k"  # engine/pyproject.toml, group sglang.srt.plugins
HICACHE_SWITCH = "--enable-hierarchical-cache"
HICACHE_VALUED_FLAGS = (
    "--hicache-ratio", "--hicache-size", "--hicache-write-policy", "--hicache-mem-layout"
)  # fmt: skip
# A GPU the NVIDIA container runtime gives a container (a pod's nvidia.com/gpu) is one of these.
NVIDIA_DEVICES = "/dev/nvidia[0-9]*"
MODULE_ARGS_FROM = 3  # an engine command: PYTHON -m MODULE ARGS...


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "launch",
        help="start the engine an engine.yaml describes (the image entrypoint)",
        description="Validate engine.yaml and exec SGLang (with the dsv4 plugin) or, with "
        "backend: reference, the CPU reference engine.",
    )
    p.add_argument("--config", type=Path, required=True, help="path to engine.yaml")
    p.add_argument(
        "--dry-run", action="store_true", help="print the environment and command, do not exec"
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="as --dry-run, and check that the engine accepts the command (SGLang: its "
        "plugins loaded, its parser and ServerArgs), stopping before the model and the GPU",
    )
    p.set_defaults(func=run)


def load_config(path: Path) -> EngineConfig:
    try:
        text = path.read_text()
    except OSError as err:
        raise CommandError(f"--config {path}: cannot read: {err.strerror}") from None
    try:
        return load_engine_yaml(text)
    except yaml.YAMLError as err:
        raise CommandError(f"--config {path}: not YAML: {err}") from None
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise CommandError(f"--config {path}: {where}: {first['msg']}") from None


def reference_args(config: EngineConfig) -> list[str]:
    """`dsv4-engine serve` flags for a reference engine pod (SGLang names throughout)."""
    if config.tp != 1 or config.dp != 1 or config.ep != 1 or config.multinode is not None:
        raise CommandError(
            "backend: reference runs on one CPU process: expected tp=dp=ep=1 and no multinode"
        )
    args = [
        "serve",
        "--host", config.host,
        "--port", str(config.port),
        "--model-path", config.model_path,
        "--served-model-name", config.served_model_name,
        "--reference-model", config.reference_model.value,
        "--index-dtype", config.features.index_dtype.value,
        "--kv-canary", CANARY_ARG[config.features.kv_canary],
        "--disaggregation-mode", config.role.value,
        "--disaggregation-bootstrap-port", str(config.disaggregation.bootstrap_port),
    ]  # fmt: skip
    if share := config.features.fault_injection.benign_nondeterminism:
        args += ["--benign-nondeterminism", f"{share:g}"]
    if config.max_total_tokens is not None:
        args += ["--max-total-tokens", str(config.max_total_tokens)]
    return args + _hicache_args(to_sglang_args(config))


def _hicache_args(sglang_args: list[str]) -> list[str]:
    """The HiCache flags of the SGLang command line: `serve` takes them by the same names."""
    out: list[str] = []
    for i, arg in enumerate(sglang_args):
        if arg == HICACHE_SWITCH:
            out.append(arg)
        elif arg in HICACHE_VALUED_FLAGS:
            out += [arg, sglang_args[i + 1]]
    return out


def fault_env(config: EngineConfig) -> dict[str, str]:
    """The environment that injects the configured fault into a reference engine."""
    share = config.features.fault_injection.env_value()
    return {} if share is None else {UNGATED_INDEX_K_ENV: share}


def sglang_placement(config: EngineConfig) -> tuple[int, str | None]:
    if config.multinode is None:
        return 0, None
    try:
        placement = place_pod(config.multinode, os.environ)
    except ValueError as err:
        raise CommandError(f"multinode: {err}") from None
    return placement.node_rank, placement.dist_init_addr


def command(config: EngineConfig) -> tuple[list[str], dict[str, str]]:
    """(argv, extra environment) of the engine process."""
    if config.backend is Backend.REFERENCE:
        return [sys.executable, "-m", "dsv4_engine.cli", *reference_args(config)], fault_env(config)
    if (injected := config.features.fault_injection.injected) is not None:
        raise CommandError(
            f"features.faultInjection.{injected}: only backend: reference can inject "
            "faults; refusing to start SGLang with it"
        )
    unstored = sglang_index_dtype_error(config.features.index_dtype)
    if unstored is not None:  # SGLang would run fp8 under a bf16 label
        raise CommandError(f"features.{unstored}")
    rank, addr = sglang_placement(config)
    # plugin_env carries the index-K dtype under the name dsv4_engine.sglang_plugin reads
    # (the plugin refuses, at pool sizing, a dtype SGLang does not store, as above).
    env = {PLUGINS_ENV: PLUGIN_ENTRY_POINT, **plugin_env(config)}
    argv = [sys.executable, "-m", "sglang.launch_server", *to_sglang_args(config, rank, addr)]
    return argv, env


def check(config: EngineConfig, argv: list[str], env: dict[str, str]) -> str:
    """Parses the engine's arguments as the engine will, without starting it; returns what
    accepted them.  A refusal ends the process as the engine's own parser ends it (its usage
    error, exit 2)."""
    if config.backend is Backend.REFERENCE:
        from dsv4_engine.commands import serve

        parser = OneLineParser(prog="dsv4-engine serve")
        serve.add_serve_arguments(parser)
        serve.settings_from_args(parser.parse_args(argv[MODULE_ARGS_FROM + 1 :]))  # after `serve`
        return "dsv4-engine serve's parser"
    os.environ.update(env)  # the plugin whitelisted and configured, as in the exec'd engine
    import sglang
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args

    load_plugins()
    prepare_server_args(argv[MODULE_ARGS_FROM:])
    return f"SGLang {sglang.__version__}'s load_plugins(), parser and ServerArgs"


def missing_gpu(config: EngineConfig) -> str | None:
    """Why this engine cannot start in this container, or None."""
    if config.backend is Backend.REFERENCE or glob.glob(NVIDIA_DEVICES):
        return None
    return (
        f"backend: sglang needs NVIDIA GPUs and this container has none (no {NVIDIA_DEVICES}): "
        "its pod must request nvidia.com/gpu on a GPU node; not starting SGLang "
        "(--check checks the command without one)"
    )


def run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    argv, env = command(config)
    if args.dry_run or args.check:
        for key, value in sorted(env.items()):
            print(f"{key}={shlex.quote(value)}")
        print(shlex.join(argv))
        if args.check:
            print(f"# accepted by {check(config, argv, env)}; not started", flush=True)
        return 0
    if (missing := missing_gpu(config)) is not None:
        raise CommandError(missing)
    sys.stdout.flush()
    os.execve(argv[0], argv, {**os.environ, **env})
    return 0  # not reached
