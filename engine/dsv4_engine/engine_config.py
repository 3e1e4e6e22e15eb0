"""`engine.yaml`: what the operator tells one engine pod to run, and its SGLang arguments.

The operator renders this model into the engine ConfigMap; `dsv4-engine launch --config
/etc/dsv4/engine.yaml` reads it back.  `to_sglang_args` is the ONE place that turns the
configuration into SGLang 0.5.23 server arguments, so the flags the operator owns are
listed here too (`OPERATOR_OWNED_FLAGS`) and user `extraArgs` cannot override them.
Pure pydantic, no torch: the operator imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated

import yaml
from pydantic import Field, StringConstraints, model_validator

from dsv4_engine.features import CamelModel, EngineFeatures, IndexDtype, KvCanary, Role


class Backend(StrEnum):
    """`sglang` runs the real engine; `reference` the tiny CPU reference engine."""

    SGLANG = "sglang"
    REFERENCE = "reference"


class ReferenceModelKind(StrEnum):
    """Which model the CPU reference engine (`backend: reference`) loads.

    `random`: seeded random weights — answers are noise, so only warm-vs-cold consistency
    can judge them.  `echo`: constructed weights that follow the tool-call echo prompt
    (`dsv4_engine.reference.echo`), so the tool-call echo probes judge it as they judge a
    real model.  SGLang ignores the choice: it serves the weights at `model_path`.
    """

    RANDOM = "random"
    ECHO = "echo"


class TransferBackend(StrEnum):
    MOONCAKE = "mooncake"
    NIXL = "nixl"


class GroupRole(StrEnum):
    """A pod's place in a multi-node replica: node rank 0 (serves HTTP) or another rank."""

    LEADER = "leader"
    WORKER = "worker"


# What LeaderWorkerSet's pod webhook sets in every pod of a group (sigs.k8s.io/lws
# api/leaderworkerset/v1: LwsLeaderAddress, LwsWorkerIndex, LwsGroupSize).
LWS_LEADER_ADDRESS = "LWS_LEADER_ADDRESS"
LWS_WORKER_INDEX = "LWS_WORKER_INDEX"
LWS_GROUP_SIZE = "LWS_GROUP_SIZE"


# Every flag `to_sglang_args` may emit, with SGLang's aliases for the same destinations
# (checked against SGLang's own parser in tests/unit/engine/test_engine_config_sglang.py).
OPERATOR_OWNED_FLAGS: tuple[str, ...] = (
    "--model-path",
    "--model",
    "--served-model-name",
    "--tool-call-parser",
    "--tp-size",
    "--tensor-parallel-size",
    "--dp-size",
    "--data-parallel-size",
    "--attn-dp-size",
    "--attention-data-parallel-size",
    "--enable-dp-attention",
    "--ep-size",
    "--expert-parallel-size",
    "--ep",
    "--nnodes",
    "--node-rank",
    "--dist-init-addr",
    "--nccl-init-addr",
    "--disaggregation-mode",
    "--disaggregation-transfer-backend",
    "--disaggregation-bootstrap-port",
    "--disaggregation-ib-device",
    "--enable-hierarchical-cache",
    "--enable-hicache",
    "--hicache-ratio",
    "--hicache-size",
    "--hicache-write-policy",
    "--hicache-mem-layout",
    "--kv-canary",
    "--enable-deepseek-v4-fp4-indexer",
    "--enable-metrics",
    "--max-total-tokens",
    "--host",
    "--port",
)


# SGLang flags that size the KV pools: the operator sizes each engine pod's memory (the
# HiCache host tier) with SGLang's defaults for them (`configurator.settings`), so another
# value in extraArgs would contradict the pod it runs in.  Refused, with their own reason.
TRANSFER_FORMAT_FLAGS: tuple[str, ...] = ("--page-size", "--kv-cache-dtype")

# SGLang 0.5.23 flags that bring in what the revision does not hold: code (remote model
# code, custom logit processors and weight loaders, request-supplied chat templates, tool
# servers), a file, directory or URL read at start (a config merged into the arguments —
# `--config` can set any flag, the owned ones included —, templates, a tokenizer apart from
# the model, other weights, adapters and draft models, storage and cache configs), keys, and
# files written outside the pod's scratch.  What such a file holds is never canaried: it
# can change without a revision.  Refused in extraArgs, by the same prefix test as the owned
# flags; each is checked against SGLang's own parser, aliases included
# (tests/unit/engine/test_engine_config_sglang.py).
UNTRACKED_INPUT_FLAGS: tuple[str, ...] = (
    # code
    "--trust-remote-code",
    "--enable-custom-logit-processor",
    "--custom-weight-loader",
    "--trust-request-chat-template",
    "--tool-server",
    # a config merged into the arguments or the model's, or read by a component
    "--config",
    "--json-model-override-args",
    "--decrypted-config-file",
    "--decrypted-draft-config-file",
    "--model-loader-extra-config",
    "--hicache-storage-backend-extra-config",
    "--hierarchical-sparse-attention-extra-config",
    "--hisparse-config",
    "--flexkv-config-file",
    "--lmcache-config-file",
    "--mm-process-config",
    "--pdmux-config-path",
    "--kv-events-config",
    "--modelexpress-config",
    "--radix-eviction-policy-config",
    "--unified-cache-external-linker-config",
    "--speculative-adaptive-config",
    "--deepep-config",
    "--cuda-graph-config",
    "--msprobe-dump-config",
    "--watermark-config",
    # templates and a tokenizer apart from the model
    "--chat-template",
    "--completion-template",
    "--tokenizer-path",
    # other weights, adapters, draft models and corpora
    "--load-format",
    "--download-dir",
    "--quantization-param-path",
    "--kt-weight-path",
    "--modelopt-checkpoint-restore-path",
    "--enable-lora",
    "--lora-paths",
    "--uno-lora-path",
    "--speculative-draft-model-path",
    "--speculative-draft-model",
    "--speculative-draft-load-format",
    "--speculative-ngram-external-corpus-path",
    "--speculative-dspark-confidence-sts-path",
    "--speculative-dspark-sps-table-path",
    "--remote-instance-weight-loader-backend",
    "--remote-instance-weight-loader-seed-instance-ip",
    "--remote-instance-weight-loader-seed-instance-service-port",
    "--remote-instance-weight-loader-send-weights-group-ports",
    "--remote-instance-weight-loader-start-seed-via-transfer-engine",
    # keys (the admin API is the operator's to close), and what serves past SGLang's HTTP
    # auth (dsv4_engine.sglang_plugin.admin_surface): more than one tokenizer worker (the
    # auth middleware "is only supported in single tokenizer mode", http_server.py) and a
    # gRPC listener ("bypasses HTTP auth middleware", arg_groups/serving_hook.py)
    "--admin-api-key",
    "--api-key",
    "--tokenizer-worker-num",
    "--grpc-port",
    "--grpc-mode",
    "--smg-grpc-mode",
    "--ssl-keyfile",
    "--ssl-certfile",
    "--ssl-ca-certs",
    "--ssl-keyfile-password",
    # files written outside the pod's scratch
    "--export-metrics-to-file-dir",
    "--file-storage-path",
    "--debug-tensor-dump-input-file",
    "--spec-trace-dir",
    "--modelopt-checkpoint-save-path",
    "--modelopt-export-path",
    "--ple-offload-dir",
)
# SGLang options that begin a refused flag's name yet are options of their own: argparse
# takes an exact name over an abbreviation, so these are not refused as prefixes.
UNTRACKED_PREFIXES_OF_THEIR_OWN: tuple[str, ...] = (
    "--export-metrics-to-file",
    "--hicache-storage-backend",
    "--quantization",
    "--radix-eviction-policy",
    "--speculative-adaptive",
)

# Environment the launcher sets from typed fields, or LeaderWorkerSet sets for a group: a
# user `env` entry of the same name would contradict the field (refused in `env`).
INDEX_DTYPE_ENV = "DSV4_INDEX_DTYPE"  # features.indexDtype, read by the SGLang plugin
UNGATED_INDEX_K_ENV = "DSV4_INJECT_UNGATED_INDEX_K"  # features.faultInjection
PLUGINS_ENV = "SGLANG_PLUGINS"  # the project's SGLang plugin
# The revision of what an engine runs: its role's engine-config hash (the pod template's
# `inference.dsv4.dev/engine-config-hash`), set by the operator on every engine container.
# The engines label what they count of live answers with it, so one configuration's live
# rates are told apart from another's behind the same Service.
REVISION_ENV = "DSV4_REVISION"
OPERATOR_OWNED_ENV: tuple[str, ...] = (
    INDEX_DTYPE_ENV,
    UNGATED_INDEX_K_ENV,
    PLUGINS_ENV,
    REVISION_ENV,
    LWS_LEADER_ADDRESS,
    LWS_WORKER_INDEX,
    LWS_GROUP_SIZE,
)


def flag_in(
    extra_args: list[str] | tuple[str, ...],
    flags: tuple[str, ...],
    own: tuple[str, ...] = (),
) -> str | None:
    """The first extra argument that would set one of ``flags``, else None.

    argparse accepts any unambiguous prefix of a long option (`--tp` means `--tp-size`),
    so a token is refused when it is a prefix of a listed flag, not only when it equals
    one — unless it is in ``own``: an option of its own name, which argparse takes exactly.
    The CRD's CEL rules for `extraArgs` are the same test.
    """
    for arg in extra_args:
        if not arg.startswith("--"):
            continue
        flag = arg.split("=", 1)[0]
        if flag not in own and any(listed.startswith(flag) for listed in flags):
            return arg
    return None


def owned_flag_in(extra_args: list[str] | tuple[str, ...]) -> str | None:
    return flag_in(extra_args, OPERATOR_OWNED_FLAGS)


def transfer_flag_in(extra_args: list[str] | tuple[str, ...]) -> str | None:
    return flag_in(extra_args, TRANSFER_FORMAT_FLAGS)


def untracked_flag_in(extra_args: list[str] | tuple[str, ...]) -> str | None:
    return flag_in(extra_args, UNTRACKED_INPUT_FLAGS, UNTRACKED_PREFIXES_OF_THEIR_OWN)


class Disaggregation(CamelModel):
    transfer_backend: TransferBackend = TransferBackend.MOONCAKE
    # RDMA device names (`mlx5_0`): one per NIC of a node, at most.
    ib_devices: tuple[Annotated[str, StringConstraints(max_length=64)], ...] = Field(
        default=(), max_length=32
    )
    bootstrap_port: int = Field(default=8998, ge=1, le=65535)


class MultiNode(CamelModel):
    """A replica spanning `nnodes` nodes: one LeaderWorkerSet group, one pod per node.

    The group's pods learn their place from LWS's environment (`place_pod`): the worker
    index is SGLang's node rank (the leader is 0) and the leader's stable DNS name, with
    `dist_init_port`, is every rank's `--dist-init-addr`.
    """

    nnodes: int = Field(ge=2)
    dist_init_port: int = Field(default=5000, ge=1, le=65535)


class NodePlacement(CamelModel):
    node_rank: int = Field(ge=0)
    dist_init_addr: str


def place_pod(multinode: MultiNode, env: Mapping[str, str]) -> NodePlacement:
    """Node rank and `--dist-init-addr` of one pod of a group, from LWS's environment;
    a missing variable or a group of another size is refused (the pod is not in the group
    this config was rendered for)."""
    missing = [k for k in (LWS_LEADER_ADDRESS, LWS_WORKER_INDEX, LWS_GROUP_SIZE) if not env.get(k)]
    if missing:
        raise ValueError(
            f"{', '.join(missing)} not set: a multi-node replica runs as a LeaderWorkerSet "
            "group, whose pod webhook sets them"
        )
    size, index = env[LWS_GROUP_SIZE], env[LWS_WORKER_INDEX]
    if not size.isdigit() or int(size) != multinode.nnodes:
        raise ValueError(
            f"{LWS_GROUP_SIZE}={size!r}, but the engine config has nnodes {multinode.nnodes}"
        )
    if not index.isdigit() or int(index) >= multinode.nnodes:
        raise ValueError(f"{LWS_WORKER_INDEX}={index!r} is not a rank below {multinode.nnodes}")
    addr = f"{env[LWS_LEADER_ADDRESS]}:{multinode.dist_init_port}"
    return NodePlacement(node_rank=int(index), dist_init_addr=addr)


class EngineConfig(CamelModel):
    """The content of `engine.yaml` for one role."""

    role: Role
    backend: Backend = Backend.SGLANG
    reference_model: ReferenceModelKind = ReferenceModelKind.RANDOM
    model_path: str
    served_model_name: str
    tool_call_parser: str = "deepseekv4"
    tp: int = Field(default=1, ge=1)
    dp: int = Field(default=1, ge=1)
    ep: int = Field(default=1, ge=1)
    enable_dp_attention: bool = False
    multinode: MultiNode | None = None
    disaggregation: Disaggregation = Disaggregation()
    features: EngineFeatures = EngineFeatures()
    extra_args: tuple[str, ...] = ()
    max_total_tokens: int | None = Field(default=None, ge=1)
    """The device KV pool's cap in tokens (SGLang's `--max-total-tokens`); None: the
    engine sizes the pool itself.  A canary's HiCache roles always run with one (the
    operator's `CanarySpec.device_pool_tokens`), so its probe reads prefixes back from the
    host tier by eviction."""
    host: str = "0.0.0.0"
    """The address the engine binds: every interface of its pod.  (The local runtime binds
    each pod's process to the pod's own IP, as a pod's network namespace would.)"""
    port: int = Field(default=30000, ge=1, le=65535)

    @model_validator(mode="after")
    def _extra_args_do_not_override(self) -> EngineConfig:
        owned = owned_flag_in(self.extra_args)
        if owned is not None:
            raise ValueError(
                f"extraArgs: {owned!r} sets a flag the operator owns; use the typed field"
            )
        return self

    def hicache_on(self) -> bool:
        hicache = self.features.hicache
        return hicache.enabled and self.role in hicache.roles


# `--kv-canary`, by SGLang's names (the reference engine takes the same flag).
CANARY_ARG = {KvCanary.OFF: "none", KvCanary.LOG: "log", KvCanary.RAISE: "raise"}


def to_sglang_args(
    config: EngineConfig, node_rank: int = 0, dist_init_addr: str | None = None
) -> list[str]:
    """SGLang 0.5.23 server arguments for one pod (node rank and rank-0 address per pod).

    DP attention uses `--attn-dp-size` (0.5.23 deprecates `--enable-dp-attention`).
    fp4 index-K is SGLang's own flag; the project's SGLang plugin reads the dtype from
    `plugin_env` and refuses one SGLang does not store (bf16).
    """
    args = [
        "--model-path", config.model_path,
        "--served-model-name", config.served_model_name,
        "--tool-call-parser", config.tool_call_parser,
        "--host", config.host,
        "--port", str(config.port),
        "--tp-size", str(config.tp),
        "--ep-size", str(config.ep),
        "--enable-metrics",
        "--kv-canary", CANARY_ARG[config.features.kv_canary],
        "--disaggregation-mode", config.role.value,
        "--disaggregation-transfer-backend", config.disaggregation.transfer_backend.value,
        "--disaggregation-bootstrap-port", str(config.disaggregation.bootstrap_port),
    ]  # fmt: skip
    args += ["--attn-dp-size" if config.enable_dp_attention else "--dp-size", str(config.dp)]
    if config.disaggregation.ib_devices:
        args += ["--disaggregation-ib-device", ",".join(config.disaggregation.ib_devices)]
    if config.multinode is not None:
        if dist_init_addr is None:
            raise ValueError("a multi-node engine needs dist_init_addr (see place_pod)")
        args += ["--nnodes", str(config.multinode.nnodes), "--node-rank", str(node_rank)]
        args += ["--dist-init-addr", dist_init_addr]
    if config.hicache_on():
        hicache = config.features.hicache
        args.append("--enable-hierarchical-cache")
        if hicache.size_gb is not None:
            args += ["--hicache-size", str(hicache.size_gb)]
        else:
            args += ["--hicache-ratio", str(hicache.ratio)]
        args += ["--hicache-write-policy", hicache.write_policy.value]
        args += ["--hicache-mem-layout", hicache.mem_layout.value]
    if config.features.index_dtype is IndexDtype.FP4:
        args.append("--enable-deepseek-v4-fp4-indexer")
    if config.max_total_tokens is not None:
        args += ["--max-total-tokens", str(config.max_total_tokens)]
    return args + list(config.extra_args)


def plugin_env(config: EngineConfig) -> dict[str, str]:
    """Environment for the project's SGLang plugin: the index-K dtype it checks."""
    return {INDEX_DTYPE_ENV: config.features.index_dtype.value}


def dump_engine_yaml(config: EngineConfig) -> str:
    """Canonical YAML (sorted keys, camelCase): equal configs give byte-equal files."""
    data = config.model_dump(mode="json", by_alias=True)
    return yaml.safe_dump(data, sort_keys=True)


def load_engine_yaml(text: str) -> EngineConfig:
    return EngineConfig.model_validate(yaml.safe_load(text))
