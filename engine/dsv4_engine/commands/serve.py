"""`dsv4-engine serve`: the CPU reference engine (OpenAI API on loopback or any host).

Flags carry SGLang's names where SGLang has the flag, so the same command line shape
starts either engine.  Ready when `GET /health` answers 200.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import signal
import socket
from enum import StrEnum
from typing import TypeVar

from dsv4_engine.cliutil import CommandError
from dsv4_engine.engine_config import ReferenceModelKind
from dsv4_engine.features import HiCacheMemLayout, HiCacheWritePolicy, IndexDtype
from dsv4_engine.reference.settings import (
    DEFAULT_HICACHE_RATIO,
    DisaggregationMode,
    ServeSettings,
    SettingsError,
)

logger = logging.getLogger("dsv4_engine.serve")
E = TypeVar("E", bound=StrEnum)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve",
        help="run the CPU reference engine (OpenAI API)",
        description="Tiny DeepSeek-V4-shaped engine on the project's pools, HiCache, gate and "
        "kernels.  Ready when GET /health answers 200.",
    )
    add_serve_arguments(p)
    p.set_defaults(func=run)


_DEFAULTS = ServeSettings()


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """SGLang's flag names and defaults (`reference.settings`); `None`: the engine decides."""
    p.add_argument("--host", default=_DEFAULTS.host)
    p.add_argument("--port", type=int, default=_DEFAULTS.port)
    p.add_argument("--model-path", help="accepted for SGLang compatibility; weights are seeded")
    p.add_argument(
        "--served-model-name", help=f"default: the model path, else {_DEFAULTS.served_model_name}"
    )
    p.add_argument(
        "--reference-model",
        default=_DEFAULTS.reference_model.value,
        help="random (seeded random weights: judge it by warm-vs-cold consistency) | echo "
        "(constructed weights that answer the tool-call echo prompt)",
    )
    p.add_argument(
        "--tp", "--tp-size", dest="tp", type=int, default=_DEFAULTS.tp, help="must be 1 on CPU"
    )
    p.add_argument("--page-size", type=int, help=f"default: {_DEFAULTS.page_size}")
    p.add_argument(
        "--index-dtype",
        default=_DEFAULTS.index_dtype.value,
        help="index-K storage: fp8 | bf16 | fp4",
    )
    p.add_argument("--enable-hierarchical-cache", "--enable-hicache", action="store_true")
    p.add_argument("--hicache-ratio", type=float, help=f"default: {DEFAULT_HICACHE_RATIO}")
    p.add_argument(
        "--hicache-size",
        type=int,
        default=_DEFAULTS.hicache_size,
        help="host tier GiB (overrides the ratio; 0: use the ratio)",
    )
    p.add_argument("--hicache-write-policy", default=_DEFAULTS.hicache_write_policy.value)
    p.add_argument("--hicache-mem-layout", default=_DEFAULTS.hicache_mem_layout.value)
    p.add_argument(
        "--hicache-bandwidth",
        type=float,
        default=_DEFAULTS.hicache_bandwidth_mb_s,
        help=f"host→device copy speed in MB/s after each layer's latency (default "
        f"{_DEFAULTS.hicache_bandwidth_mb_s:g}; 0: unthrottled)",
    )
    p.add_argument(
        "--hicache-layer-latency",
        type=float,
        default=_DEFAULTS.hicache_layer_latency_ms,
        help=f"ms before each layer of a host→device load starts landing (default "
        f"{_DEFAULTS.hicache_layer_latency_ms:g}): gated reads wait for it.  "
        "DSV4_INJECT_UNGATED_INDEX_K shows in answers at any latency and bandwidth: a raced "
        "load's index-K lands after its step's indexer read it",
    )
    p.add_argument(
        "--max-running-requests", type=int, help=f"default: {_DEFAULTS.max_running_requests}"
    )
    p.add_argument("--max-total-tokens", type=int, help=f"default: {_DEFAULTS.max_total_tokens}")
    p.add_argument("--context-length", type=int, help=f"default: {_DEFAULTS.context_length}")
    p.add_argument("--random-seed", type=int, help=f"default: {_DEFAULTS.random_seed}")
    p.add_argument(
        "--disaggregation-mode", default=_DEFAULTS.disaggregation_mode.value,
        help="null | prefill | decode",
    )  # fmt: skip
    p.add_argument(
        "--disaggregation-bootstrap-port", type=int, default=_DEFAULTS.disaggregation_bootstrap_port
    )
    p.add_argument(
        "--kv-canary",
        choices=("none", "log", "raise"),
        default=_DEFAULTS.kv_canary,
        help="SGLang's KV integrity check: log/raise count stale reads into "
        "dsv4:kv_canary_violations_total on /metrics",
    )
    p.add_argument(
        "--benign-nondeterminism",
        type=float,
        default=_DEFAULTS.benign_nondeterminism,
        help="share of prefix-cache hits whose first token flips to the runner-up, as "
        "healthy non-deterministic engines do (random model only; /server_info then says "
        "deterministic: false)",
    )
    p.add_argument("--log-level", default="info")


def _choice(flag: str, value: str, enum: type[E]) -> E:
    try:
        return enum(value)
    except ValueError:
        allowed = " | ".join(m.value for m in enum)
        raise CommandError(f"{flag} {value!r}: expected one of {allowed}") from None


def settings_from_args(args: argparse.Namespace) -> ServeSettings:
    """The settings the flags ask for; a flag left unset keeps the engine's own choice."""
    given = {
        "served_model_name": args.served_model_name or args.model_path,
        "page_size": args.page_size,
        "hicache_ratio": args.hicache_ratio,
        "max_running_requests": args.max_running_requests,
        "max_total_tokens": args.max_total_tokens,
        "context_length": args.context_length,
        "random_seed": args.random_seed,
    }
    try:
        return ServeSettings(
            host=args.host,
            port=args.port,
            model_path=args.model_path,
            reference_model=_choice("--reference-model", args.reference_model, ReferenceModelKind),
            tp=args.tp,
            index_dtype=_choice("--index-dtype", args.index_dtype, IndexDtype),
            enable_hierarchical_cache=args.enable_hierarchical_cache,
            hicache_size=args.hicache_size,
            hicache_write_policy=_choice(
                "--hicache-write-policy", args.hicache_write_policy, HiCacheWritePolicy
            ),
            hicache_mem_layout=_choice(
                "--hicache-mem-layout", args.hicache_mem_layout, HiCacheMemLayout
            ),
            hicache_bandwidth_mb_s=args.hicache_bandwidth,
            hicache_layer_latency_ms=args.hicache_layer_latency,
            disaggregation_mode=_choice(
                "--disaggregation-mode", args.disaggregation_mode, DisaggregationMode
            ),
            disaggregation_bootstrap_port=args.disaggregation_bootstrap_port,
            kv_canary=args.kv_canary,
            benign_nondeterminism=args.benign_nondeterminism,
            **{name: value for name, value in given.items() if value is not None},
        )
    except SettingsError as err:
        raise CommandError(str(err)) from None


def check_port_free(host: str, port: int, flag: str) -> None:
    """Fail before loading anything when the port is taken (one line, not a traceback)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise CommandError(
                    f"{flag} {port}: address {host}:{port} is already in use"
                ) from None
            raise CommandError(
                f"{flag} {port}: cannot bind {host}:{port}: {err.strerror}"
            ) from None


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    settings = settings_from_args(args)
    check_port_free(settings.host, settings.port, "--port")
    if settings.disaggregation_mode is DisaggregationMode.PREFILL:
        check_port_free(
            settings.host, settings.disaggregation_bootstrap_port, "--disaggregation-bootstrap-port"
        )
    from dsv4_engine.pools.device_pool import ungated_index_k_from_env  # imports torch

    try:
        ungated_index_k_from_env()
    except ValueError as err:
        raise CommandError(str(err)) from None
    asyncio.run(_serve(settings))
    return 0


async def _serve(settings: ServeSettings) -> None:
    from aiohttp import web

    from dsv4_engine.reference import pd
    from dsv4_engine.reference.engine import Engine
    from dsv4_engine.reference.server import ReferenceServer

    engine = Engine(settings)
    engine.start()
    server = ReferenceServer(settings, engine)
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port, backlog=1024)
    bootstrap = None
    try:
        await site.start()
        if settings.disaggregation_mode is DisaggregationMode.PREFILL:
            bootstrap = await pd.serve_bootstrap(
                settings.host,
                settings.disaggregation_bootstrap_port,
                server.rooms,
                server.transfer_format,
            )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        print(f"dsv4-engine serve: ready on http://{settings.host}:{settings.port}", flush=True)
        await stop.wait()
    finally:
        if bootstrap is not None:
            bootstrap.close()
        await runner.cleanup()
        engine.stop()
