"""`dsv4ctl plan`: per-pool KV sizing for one GPU rank, HiCache host memory, and what the
seed's legacy bf16 formula would cost.  Thin: parse, call the configurator, print."""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import asdict, dataclass, replace
from typing import Any

from dsv4_engine.cliutil import CommandError
from dsv4_engine.configurator import (
    DEFAULT_MEM_FRACTION_STATIC,
    ConfigError,
    EngineSettings,
    GiB,
    GpuBudget,
    LegacyComparison,
    ModelKind,
    ModelSpec,
    PoolPlan,
    compare_legacy,
    gpu_budget,
    host_bytes_for_plan,
    host_bytes_for_size,
    load_hf_config,
    model_spec_from_hf_config,
    plan_pools,
)
from dsv4_engine.engine_config import Backend
from dsv4_engine.features import IndexDtype
from dsv4_engine.presets import PRESETS, preset_config

_UNITS = {
    "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}  # fmt: skip
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]+)\s*$")


def parse_size(text: str, option: str) -> int:
    """'180GiB' -> bytes; a unit is required so 180 cannot silently mean GB or GiB."""
    match = _SIZE.match(text)
    unit = match and _UNITS.get(match.group(2).lower())
    if not match or not unit:
        raise CommandError(
            f"{option}: expected a size with a unit like 180GiB or 141GB, got {text!r}"
        )
    return int(float(match.group(1)) * unit)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan",
        help="size the KV pools of one GPU rank (per pool, HiCache host memory, legacy delta)",
        description="Size SGLang's KV pools for a DeepSeek-V4 / DSA model on one GPU rank.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model-config", metavar="PATH", help="Hugging Face config.json")
    src.add_argument("--preset", choices=sorted(PRESETS), help="a published model config")
    p.add_argument(
        "--gpu-memory", required=True, metavar="SIZE", help="memory per GPU, e.g. 180GiB"
    )
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    p.add_argument("--dp", type=int, default=1, help="attention data-parallel size (default 1)")
    p.add_argument(
        "--index-dtype",
        choices=[d.value for d in IndexDtype],
        default="fp8",
        help="index-K storage (bf16 only with --engine reference: SGLang stores fp8 or fp4)",
    )
    p.add_argument(
        "--engine",
        choices=[b.value for b in Backend],
        default=Backend.SGLANG.value,
        help="the engine whose index-K storage the plan is for (default sglang)",
    )
    p.add_argument(
        "--page-size",
        type=int,
        default=256,
        help="tokens per page (SGLang forces 256 for V4 on CUDA)",
    )
    p.add_argument(
        "--swa-ratio",
        type=float,
        default=None,
        help="--swa-full-tokens-ratio: SWA slots per full token (SGLang's default: 0.1 for "
        "deepseek_v4, request-cap sizing for deepseek_v41)",
    )
    p.add_argument(
        "--max-running-requests", type=int, default=None, help="default: SGLang's (256 for V4)"
    )
    p.add_argument("--mem-fraction-static", type=float, default=DEFAULT_MEM_FRACTION_STATIC)
    p.add_argument(
        "--weights-memory",
        metavar="SIZE",
        help="weights per rank as measured (default: estimated from the config)",
    )
    p.add_argument(
        "--speculative-draft-tokens", type=int, default=0, help="MTP draft tokens; 0 = off"
    )
    p.add_argument("--disaggregation-mode", choices=["null", "prefill", "decode"], default="null")
    p.add_argument(
        "--fp4-budget",
        choices=["fp8", "exact"],
        default="fp8",
        help="price an fp4 index-K at the fp8 size as SGLang does on NVIDIA (default) or exactly",
    )
    hicache = p.add_mutually_exclusive_group()
    hicache.add_argument(
        "--hicache-ratio", type=float, help="host pool as a multiple of the device pool"
    )
    hicache.add_argument(
        "--hicache-size", metavar="SIZE", help="host pool size per rank, e.g. 200GiB"
    )
    p.add_argument(
        "--legacy-compare", action="store_true", help="show what the seed's bf16 formula costs"
    )
    p.add_argument("--output", choices=["table", "json"], default="table")
    p.set_defaults(func=run)


def _settings(args: argparse.Namespace) -> EngineSettings:
    spec = args.speculative_draft_tokens
    return EngineSettings(
        index_dtype=IndexDtype(args.index_dtype),
        engine=Backend(args.engine),
        page_size=args.page_size,
        tp_size=args.tp,
        dp_size=args.dp,
        swa_full_tokens_ratio=args.swa_ratio,
        max_running_requests=args.max_running_requests,
        speculative_num_draft_tokens=spec,
        speculative_num_steps=max(spec - 1, 0),
        disaggregation_mode=args.disaggregation_mode,
        fp4_budget=args.fp4_budget,
    )


@dataclass(frozen=True)
class Sizing:
    """Everything one `dsv4ctl plan` computed: what the table and the JSON both print."""

    model: ModelSpec
    settings: EngineSettings
    budget: GpuBudget
    plan: PoolPlan
    host: int | None  # HiCache host bytes per rank, when asked
    legacy: LegacyComparison | None  # with --legacy-compare
    fp4_exact: PoolPlan | None  # an fp4 index-K priced exactly, when budgeted at fp8


def _size(args: argparse.Namespace) -> Sizing:
    cfg = preset_config(args.preset) if args.preset else load_hf_config(args.model_config)
    model = model_spec_from_hf_config(cfg)
    settings = _settings(args)
    weights = parse_size(args.weights_memory, "--weights-memory") if args.weights_memory else None
    budget = gpu_budget(
        model,
        settings,
        parse_size(args.gpu_memory, "--gpu-memory"),
        mem_fraction_static=args.mem_fraction_static,
        weight_bytes_per_rank=weights,
    )
    plan = plan_pools(model, settings, budget.kv_budget_bytes)
    host = None
    if args.hicache_size:
        host = host_bytes_for_size(parse_size(args.hicache_size, "--hicache-size") / GiB)
    elif args.hicache_ratio is not None:
        host = host_bytes_for_plan(model, settings, plan, args.hicache_ratio)
    legacy = (
        compare_legacy(model, settings, budget.kv_budget_bytes) if args.legacy_compare else None
    )
    fp4_exact = None
    if settings.index_dtype is IndexDtype.FP4 and settings.fp4_budget == "fp8":
        fp4_exact = plan_pools(model, replace(settings, fp4_budget="exact"), budget.kv_budget_bytes)
    return Sizing(model, settings, budget, plan, host, legacy, fp4_exact)


def run(args: argparse.Namespace) -> int:
    try:
        sizing = _size(args)
    except ConfigError as err:
        raise CommandError(str(err)) from None
    if args.output == "json":
        print(json.dumps(_as_json(sizing), indent=2))
    else:
        table = render_table(sizing)
        if args.hicache_size and sizing.model.kind is ModelKind.DSV4:
            table += (
                "\n            note: SGLang 0.5.23 refuses --hicache-size for DeepSeek-V4; "
                "its host pool is sized by --hicache-ratio only"
            )
        print(table)
    return 0


def _as_json(sizing: Sizing) -> dict[str, Any]:
    model, legacy = sizing.model, sizing.legacy
    out: dict[str, Any] = {
        "model": {
            "architecture": model.architecture,
            "kind": model.kind.value,
            "layers": model.num_layers,
        },
        "settings": {
            k: (v.value if isinstance(v, IndexDtype | Backend) else v)
            for k, v in asdict(sizing.settings).items()
        },
        "budget": asdict(sizing.budget),
        "plan": sizing.plan.to_dict(),
        "hicache_host_bytes_per_rank": sizing.host,
    }
    if legacy is not None:
        out["legacy"] = {
            "legacy_index_k_bytes": legacy.legacy.index_k_budget_bytes,
            "fixed_index_k_bytes": legacy.fixed.index_k_budget_bytes,
            "legacy_full_tokens": legacy.legacy.full_tokens,
            "fixed_full_tokens": legacy.fixed.full_tokens,
            "over_reserved_bytes_per_rank": legacy.over_reserved_bytes,
            "tokens_lost_per_rank": legacy.tokens_lost,
        }
    if sizing.fp4_exact is not None:
        out["fp4_exact"] = sizing.fp4_exact.to_dict()
    return out


def _gib(n: float) -> str:
    return f"{n / GiB:,.2f}"


def _layers(model: ModelSpec) -> str:
    if not model.compress_ratios:
        return f"{model.num_layers} layers, {model.indexer_layers} with an indexer"
    swa = model.layers_with_ratio(0)
    return f"{model.num_layers} layers: {swa} SWA-only, {model.layers_with_ratio(4)} c4, {model.layers_with_ratio(128)} c128"


def render_table(sizing: Sizing) -> str:
    model, settings, budget, plan = sizing.model, sizing.settings, sizing.budget, sizing.plan
    host, legacy, fp4_exact = sizing.host, sizing.legacy, sizing.fp4_exact
    mrr_note = "" if settings.max_running_requests else " (SGLang's V4 default)"
    weights_note = " (estimated from config)" if budget.weights_estimated else ""
    lines = [
        f"model     {model.architecture} ({model.kind.value}), {_layers(model)}",
        f"settings  tp {settings.tp_size}, attention dp {settings.dp_size}, page {plan.page_size}, "
        f"index-K {plan.index_dtype}, SWA sizing {plan.swa_mode}, max running requests per "
        f"worker {plan.max_running_requests_per_worker}{mrr_note}",
        f"memory    {_gib(budget.gpu_memory_bytes)} GiB x {budget.mem_fraction_static} - weights "
        f"{_gib(budget.weight_bytes_per_rank)} GiB{weights_note} = KV budget "
        f"{_gib(budget.kv_budget_bytes)} GiB per rank",
        "",
        f"{'pool':<12} {'bytes/token':>12} {'tokens':>14} {'GiB':>10}",
    ]
    for p in plan.pools:
        lines.append(
            f"{p.name:<12} {p.bytes_per_token:>12,.1f} {p.tokens:>14,} {_gib(p.bytes):>10}"
        )
    lines.append(f"{'total':<12} {'':>12} {'':>14} {_gib(sum(p.bytes for p in plan.pools)):>10}")
    lines += [
        "",
        f"full tokens {plan.full_tokens:,} per rank at {plan.bytes_per_full_token:,.2f} bytes per "
        f"full token, plus {_gib(plan.fixed_bytes)} GiB fixed",
        f"index-K     {plan.index_k_alloc_bytes} B per compressed token per indexer layer "
        f"(budgeted {plan.index_k_budget_bytes} B): {plan.index_k_storage}",
    ]
    if fp4_exact is not None:
        lines.append(
            f"fp4 index-K budgeted at the fp8 size, as SGLang 0.5.23 does on NVIDIA; priced exactly "
            f"({fp4_exact.index_k_budget_bytes} B) the rank would hold {fp4_exact.full_tokens:,} full "
            f"tokens (+{fp4_exact.full_tokens - plan.full_tokens:,})"
        )
    if host is not None:
        lines.append(
            f"HiCache     host memory {_gib(host)} GiB per rank, {_gib(host * settings.tp_size)} GiB "
            f"for {settings.tp_size} rank(s)"
        )
    if legacy is not None:
        lines.append(_legacy_line(legacy))
    return "\n".join(lines)


def _legacy_line(legacy: LegacyComparison) -> str:
    if legacy.legacy.index_k_budget_bytes == legacy.fixed.index_k_budget_bytes:
        return (
            f"legacy      same as fixed for index-K {legacy.fixed.index_dtype}: the legacy bug "
            "only mis-sizes bf16"
        )
    lost = legacy.tokens_lost
    share = lost / legacy.fixed.full_tokens if legacy.fixed.full_tokens else 0.0
    return (
        f"legacy      index-K budgeted at {legacy.legacy.index_k_budget_bytes} B instead of "
        f"{legacy.fixed.index_k_budget_bytes} B: over-reserves {legacy.over_reserved_bytes / 1e9:,.2f} GB "
        f"({_gib(legacy.over_reserved_bytes)} GiB) per rank and costs {lost:,} full tokens per "
        f"rank ({share:.2%})"
    )
