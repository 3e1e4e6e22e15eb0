"""`DSV4Deployment.spec`: the typed model the CRD schema is generated from.

Cross-field rules live twice on purpose, each where it is enforced: as CEL
`x-kubernetes-validations` (the API server refuses a bad object at `kubectl apply`) and as
pydantic validators (the operator refuses an object that reached it anyway, e.g. through
an older CRD, and reports `Degraded` instead of crashing).  tests/unit/operator/
test_op_api.py and the end-to-end test feed the same invalid specs
(tests/data/invalid_dsv4_specs.yaml) to both.  The known-bad combinations of the pinned
SGLang are the exception: each is written once, in `api.known_issues`, and both its CEL
rule and its check here are generated from it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field, StringConstraints, ValidationInfo, model_validator

from dsv4_engine.engine_config import (
    OPERATOR_OWNED_ENV,
    OPERATOR_OWNED_FLAGS,
    TRANSFER_FORMAT_FLAGS,
    UNTRACKED_INPUT_FLAGS,
    UNTRACKED_PREFIXES_OF_THEIR_OWN,
    Backend,
    Disaggregation,
    ReferenceModelKind,
    owned_flag_in,
    transfer_flag_in,
    untracked_flag_in,
)
from dsv4_engine.features import CamelModel, EngineFeatures, IndexDtype, Role
from dsv4_engine.index_k import SGLANG_INDEX_DTYPES, sglang_index_dtype_error
from dsv4_operator.api import known_issues
from dsv4_operator.api.allowed import DNS_SUBDOMAIN, EXTENDED_RESOURCE
from dsv4_operator.api.names import MAX_ROLE_REPLICAS
from dsv4_operator.api.rollout import MAX_POOL_TOKENS, MIN_POOL_TOKENS, CanarySpec, RolloutSpec
from dsv4_operator.api.rolls import Rolls
from dsv4_operator.api.schema import cel, validations

DEFAULT_GPU_PRODUCTS = ("NVIDIA-B200", "NVIDIA-GB200")
QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|Ki|Mi|Gi|Ti|Pi)?$"


class PullPolicy(StrEnum):
    ALWAYS = "Always"
    IF_NOT_PRESENT = "IfNotPresent"
    NEVER = "Never"


class RoutingPolicy(StrEnum):
    CACHE_AWARE = "cache_aware"
    ROUND_ROBIN = "round_robin"
    RANDOM = "random"
    POWER_OF_TWO = "power_of_two"


class ModelPreset(StrEnum):
    V4_FLASH = "v4-flash"
    V4_PRO = "v4-pro"


class PvcSource(CamelModel):
    claim_name: str = Field(min_length=1, max_length=253)
    path: str = Field(default="", max_length=1024, description="Sub-path of the weights.")


class ModelSpec(CamelModel):
    """Where the weights are: a PVC (+ path inside it) or a host path, never both."""

    model_config = validations(
        cel(
            "has(self.pvc) != has(self.hostPath)",
            "model: set exactly one of model.pvc or model.hostPath",
        )
    )

    pvc: PvcSource | None = None
    host_path: str | None = Field(default=None, min_length=1, max_length=1024)
    served_model_name: str = Field(min_length=1, max_length=253)
    tool_call_parser: str = Field(default="deepseekv4", min_length=1, max_length=63)
    preset: ModelPreset = Field(
        default=ModelPreset.V4_FLASH,
        description="Which published DeepSeek-V4 config the weights are: sizes the KV pools "
        "and the HiCache host memory the operator adds to engine pods.",
    )
    reference_model: ReferenceModelKind = Field(
        default=ReferenceModelKind.RANDOM,
        description="With `engine: reference`, the model the CPU reference engine builds "
        "instead of loading weights: `random` (seeded random weights; the canary judges it "
        "by warm-vs-cold consistency) or `echo` (constructed weights that answer the "
        "tool-call echo prompt; the canary runs the real model's probe set, tool-call echo "
        "included).  SGLang ignores it.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if (self.pvc is None) == (self.host_path is None):
            raise ValueError("model: set exactly one of model.pvc or model.hostPath")
        return self


# The GPUs every engine container requests (`gpusPerNode`); cpu and memory have no domain,
# so the extended-resource pattern refuses them already.  A device resource of one of these
# names would shadow what the operator sets itself.
GPU_RESOURCE = "nvidia.com/gpu"
SHADOWED_RESOURCES: tuple[str, ...] = (GPU_RESOURCE,)


class ImageSpec(CamelModel):
    name: str = Field(min_length=1, max_length=512, description="The engine image.")
    pull_policy: PullPolicy = PullPolicy.IF_NOT_PRESENT


class RdmaSpec(CamelModel):
    """The RDMA NICs an engine pod requests: an extended resource a device plugin serves,
    one the operator's administrator allows (`api.allowed`, allowedDeviceResources)."""

    model_config = validations(
        cel(
            f"!(self.resourceName in {list(SHADOWED_RESOURCES)}) "
            "&& !self.resourceName.split('/')[0].endsWith('kubernetes.io')",
            "resourceName must be a device plugin's resource: not one the operator sets "
            f"itself ({', '.join(SHADOWED_RESOURCES)}) nor one in the kubernetes.io domain",
            ".resourceName",
        ),
    )

    resource_name: str = Field(
        default="rdma/ib", min_length=3, max_length=253, pattern=EXTENDED_RESOURCE
    )
    count: int = Field(default=1, ge=1, le=64)

    @model_validator(mode="after")
    def _a_device(self) -> RdmaSpec:
        domain = self.resource_name.split("/", 1)[0]
        if self.resource_name in SHADOWED_RESOURCES or domain.endswith("kubernetes.io"):
            raise ValueError(
                f"resourceName {self.resource_name!r} must be a device plugin's resource: not "
                f"one the operator sets itself ({', '.join(SHADOWED_RESOURCES)}) nor one in "
                "the kubernetes.io domain"
            )
        return self


class RoleResources(CamelModel):
    cpu: str = Field(default="32", pattern=QUANTITY, max_length=32)
    memory: str = Field(default="256Gi", pattern=QUANTITY, max_length=32)
    hugepages1_gi: str | None = Field(
        default=None, alias="hugepages1Gi", pattern=QUANTITY, max_length=32
    )
    rdma: RdmaSpec | None = None


class EnvVar(CamelModel):
    name: str = Field(min_length=1, max_length=253)
    value: str = Field(default="", max_length=4096)


KnownIssueId = Annotated[str, StringConstraints(max_length=63, pattern=known_issues.ID_PATTERN)]

# Bounded lengths keep the CEL cost estimate of the extraArgs rule under the API server's limit.
ExtraArg = Annotated[str, StringConstraints(max_length=256)]


def _sets_one_of(flags: tuple[str, ...], own: tuple[str, ...] = ()) -> str:
    """CEL: extra argument `a` sets one of ``flags`` (or an argparse prefix of one that is
    not an option of its own, in ``own``): `engine_config.flag_in`."""
    listed = "[" + ", ".join(f"'{flag}'" for flag in flags) + "]"
    test = f"a.startsWith('--') && {listed}.exists(o, o.startsWith(a.split('=')[0]))"
    if not own:
        return test
    exact = "[" + ", ".join(f"'{flag}'" for flag in own) + "]"
    return f"{test} && !(a.split('=')[0] in {exact})"


_TRANSFER_ARG = (
    "extraArgs must not set --page-size or --kv-cache-dtype: they size the KV pools, and the "
    "operator sizes each engine pod's memory with SGLang's defaults for them"
)
# What a role's escape hatches may hold in all, beside each item's own bound: what every
# copy of a spec costs the operator (its caches, a pass's models, the status it keeps) is
# bounded by these, not by the API server's 1.5 MB object limit (docs/dsv4deployment.md).
MAX_EXTRA_ARGS_CHARS = 4096
MAX_ENV_CHARS = 16384
_EXTRA_ARGS_BUDGET = f"extraArgs hold at most {MAX_EXTRA_ARGS_CHARS} characters in all"
_ENV_BUDGET = f"env holds at most {MAX_ENV_CHARS} characters of names and values in all"
_UNTRACKED_ARG = (
    "extraArgs must not load code or read a file, directory, URL or key the revision does "
    "not hold (--config, --trust-remote-code, --chat-template, --tokenizer-path, "
    "--admin-api-key, …): what it brings in is never canaried; nor serve past SGLang's "
    "endpoint auth (--tokenizer-worker-num, --grpc-port)"
)
_OWNED_ENV = (
    "env must not set a variable the operator or LeaderWorkerSet sets ("
    + ", ".join(OPERATOR_OWNED_ENV)
    + "); use the typed field (features.indexDtype, features.faultInjection)"
)
_OWNED_ENV_LIST = "[" + ", ".join(f"'{name}'" for name in OPERATOR_OWNED_ENV) + "]"


class RoleSpec(CamelModel):
    """One engine role (prefill or decode): how many replicas and how each is parallelised."""

    model_config = validations(
        cel(
            "(self.gpusPerNode * self.nodesPerReplica) % self.tp == 0",
            "tp must divide gpusPerNode × nodesPerReplica",
            ".tp",
        ),
        cel("self.tp % self.ep == 0", "ep must divide tp", ".ep"),
        cel(
            "!self.enableDpAttention || (self.dp > 1 && self.tp % self.dp == 0)",
            "dp must be > 1 and divide tp when enableDpAttention is true",
            ".dp",
        ),
        cel(
            f"!self.extraArgs.exists(a, {_sets_one_of(TRANSFER_FORMAT_FLAGS)})",
            _TRANSFER_ARG,
            ".extraArgs",
        ),
        cel(
            f"!self.extraArgs.exists(a, {_sets_one_of(OPERATOR_OWNED_FLAGS)})",
            "extraArgs must not set a flag the operator owns (model, parallelism, "
            "disaggregation, HiCache, kv-canary, host/port); use the typed field",
            ".extraArgs",
        ),
        cel(
            "!self.extraArgs.exists(a, "
            f"{_sets_one_of(UNTRACKED_INPUT_FLAGS, UNTRACKED_PREFIXES_OF_THEIR_OWN)})",
            _UNTRACKED_ARG,
            ".extraArgs",
        ),
        cel(f"!self.env.exists(e, e.name in {_OWNED_ENV_LIST})", _OWNED_ENV, ".env"),
        cel(
            f"self.extraArgs.map(a, size(a)).sum() <= {MAX_EXTRA_ARGS_CHARS}",
            _EXTRA_ARGS_BUDGET,
            ".extraArgs",
        ),
        cel(
            f"self.env.map(e, size(e.name) + size(e.value)).sum() <= {MAX_ENV_CHARS}",
            _ENV_BUDGET,
            ".env",
        ),
    )

    replicas: Annotated[int, Rolls.CAPACITY] = Field(default=1, ge=0, le=MAX_ROLE_REPLICAS)
    nodes_per_replica: Annotated[int, Rolls.REVISION] = Field(default=1, ge=1, le=64)
    gpus_per_node: Annotated[int, Rolls.REVISION] = Field(default=8, ge=1, le=8)
    tp: Annotated[int, Rolls.REVISION] = Field(default=8, ge=1, le=512)
    dp: Annotated[int, Rolls.REVISION] = Field(default=1, ge=1, le=512)
    ep: Annotated[int, Rolls.REVISION] = Field(default=1, ge=1, le=512)
    enable_dp_attention: Annotated[bool, Rolls.REVISION] = False
    resources: Annotated[RoleResources, Rolls.CAPACITY] = RoleResources()
    extra_args: Annotated[tuple[ExtraArg, ...], Rolls.REVISION] = Field(default=(), max_length=64)
    max_total_tokens: Annotated[int | None, Rolls.REVISION] = Field(
        default=None,
        ge=MIN_POOL_TOKENS,
        le=MAX_POOL_TOKENS,
        description="The device KV pool's cap in tokens (SGLang `--max-total-tokens`).  Unset: "
        "the engine sizes its pool from the GPU memory left after the weights.  A canary's "
        "HiCache roles run `spec.canary.devicePoolTokens` instead.",
    )
    env: Annotated[tuple[EnvVar, ...], Rolls.REVISION] = Field(
        default=(),
        max_length=64,
        # A map keyed by name: the API server itself refuses a variable named twice.
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )

    @model_validator(mode="after")
    def _parallelism_fits(self) -> RoleSpec:
        if (self.gpus_per_node * self.nodes_per_replica) % self.tp:
            raise ValueError("tp must divide gpusPerNode × nodesPerReplica")
        if self.tp % self.ep:
            raise ValueError("ep must divide tp")
        if self.enable_dp_attention and (self.dp < 2 or self.tp % self.dp):
            raise ValueError("dp must be > 1 and divide tp when enableDpAttention is true")
        owned = owned_flag_in(self.extra_args)
        if owned is not None:
            raise ValueError(f"extraArgs must not set a flag the operator owns: {owned!r}")
        transfer = transfer_flag_in(self.extra_args)
        if transfer is not None:
            raise ValueError(f"{_TRANSFER_ARG} (got {transfer!r})")
        untracked = untracked_flag_in(self.extra_args)
        if untracked is not None:
            raise ValueError(f"{_UNTRACKED_ARG} (got {untracked!r})")
        if sum(len(a) for a in self.extra_args) > MAX_EXTRA_ARGS_CHARS:
            raise ValueError(_EXTRA_ARGS_BUDGET)
        if sum(len(e.name) + len(e.value) for e in self.env) > MAX_ENV_CHARS:
            raise ValueError(_ENV_BUDGET)
        names = [e.name for e in self.env]
        owned_env = next((n for n in names if n in OPERATOR_OWNED_ENV), None)
        if owned_env is not None:
            raise ValueError(f"{_OWNED_ENV} (got {owned_env!r})")
        twice = next((n for n in names if names.count(n) > 1), None)
        if twice is not None:
            raise ValueError(f"env must not name a variable twice (got {twice!r})")
        return self

    @property
    def gpus_per_replica(self) -> int:
        return self.gpus_per_node * self.nodes_per_replica


class RouterSpec(CamelModel):
    replicas: Annotated[int, Rolls.CAPACITY] = Field(default=1, ge=0, le=64)
    policy: Annotated[RoutingPolicy, Rolls.REVISION] = RoutingPolicy.CACHE_AWARE
    image: Annotated[str | None, Rolls.REVISION] = Field(
        default=None, max_length=512, description="Router image; the engine image if unset."
    )


class TolerationOperator(StrEnum):
    EXISTS = "Exists"
    EQUAL = "Equal"


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class Toleration(CamelModel):
    key: str = Field(default="", max_length=317)
    operator: TolerationOperator = TolerationOperator.EQUAL
    value: str = Field(default="", max_length=63)
    effect: TaintEffect | None = None


# A label key (an optional DNS prefix, `/`, a name) and a label value, at their Kubernetes
# limits.
LabelKey = Annotated[str, StringConstraints(min_length=1, max_length=317)]
LabelValue = Annotated[str, StringConstraints(max_length=63)]


class PlacementSpec(CamelModel):
    model_config = validations(
        cel(
            "!has(self.nodeSelector) || self.nodeSelector.all(k, size(k) <= 317)",
            "nodeSelector keys are label keys: at most 317 characters",
            ".nodeSelector",
        ),
    )

    gpu_products: tuple[LabelValue, ...] = Field(
        default=DEFAULT_GPU_PRODUCTS,
        min_length=1,
        max_length=16,
        description="Allowed values of the nvidia.com/gpu.product node label.",
    )
    node_selector: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=32)
    tolerations: tuple[Toleration, ...] = Field(default=(), max_length=32)
    topology_key: str | None = Field(
        default=None,
        max_length=317,
        description="Node label of the NVLink domain (e.g. nvidia.com/gpu.clique) to spread over.",
    )
    priority_class_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="PriorityClass of the engine pods (the stable's and the canary's); one "
        "the operator's administrator allows (allowedPriorityClasses, none as shipped).  "
        "Unset: the cluster's default priority.",
    )


_NO_HICACHE_SIZE = (
    "features.hicache.sizeGB: SGLang 0.5.23 refuses --hicache-size for DeepSeek-V4 "
    "(the host pool is sized by ratio only); set features.hicache.ratio instead"
)
# The refusal of an index-K dtype SGLang does not store: the engine's own rule and words
# (dsv4_engine.index_k), for the API server's CEL rule and the operator's validator alike.
_SGLANG_DTYPES = "[" + ", ".join(f"'{d.value}'" for d in SGLANG_INDEX_DTYPES) + "]"
_NOT_ON_SGLANG = "features." + next(
    message for d in IndexDtype if (message := sglang_index_dtype_error(d)) is not None
)


# Validation context of a spec rebuilt from admitted parts (`rollout.slices.with_revision`:
# the live spec with a stable or canary revision's engine fields).  The known-issue check
# judges what a person asks for; a revision was judged, acknowledgements included, when it
# was asked for, and rebuilding it later — after the acknowledgement went with the flags
# that needed it — must not refuse the pods that run it.
REVISION_ADMITTED = "revision-admitted"


class DSV4DeploymentSpec(CamelModel):
    # The engine flag model allows a size (other engines take one); DeepSeek-V4 on
    # SGLang 0.5.23 would crash-loop on it, so the deployment refuses it up front.
    model_config = validations(
        cel("!has(self.features.hicache.sizeGB)", _NO_HICACHE_SIZE, ".features.hicache.sizeGB"),
        cel(
            f"self.engine == 'reference' || self.features.indexDtype in {_SGLANG_DTYPES}",
            _NOT_ON_SGLANG,
            ".features.indexDtype",
        ),
        *known_issues.rules(),
    )

    engine: Annotated[Backend, Rolls.REVISION] = Field(
        default=Backend.SGLANG,
        description="What the engine pods run: `sglang` (SGLang 0.5.23 with the project's "
        "plugin, on GPUs) or `reference` (the CPU reference engine: GPU-less clusters, CI "
        "and the local playground).  Picks the canary's probe set and the index-K dtypes "
        "offered (bf16 only on the reference engine).",
    )
    model: Annotated[ModelSpec, Rolls.REVISION]
    image: Annotated[ImageSpec, Rolls.REVISION]
    prefill: RoleSpec
    decode: RoleSpec
    router: RouterSpec = RouterSpec()
    placement: Annotated[PlacementSpec, Rolls.PLACEMENT] = PlacementSpec()
    features: Annotated[EngineFeatures, Rolls.REVISION] = EngineFeatures()
    disaggregation: Annotated[Disaggregation, Rolls.REVISION] = Disaggregation()
    progress_deadline_seconds: Annotated[int, Rolls.CONTROL] = Field(
        default=1800,
        ge=10,
        le=7 * 86400,
        description="A role whose replicas make no progress (none more ready or updated) for "
        "this long while not Ready makes the deployment Degraded (reason "
        "ProgressDeadlineExceeded), with the pods' reasons in the message.  The default leaves "
        "room for loading DeepSeek-V4 weights; Kubernetes' Deployments use 600.",
    )
    rollout: Annotated[RolloutSpec, Rolls.CONTROL] = Field(
        default=RolloutSpec(), description="How passed flags are promoted; production watch."
    )
    canary: Annotated[CanarySpec, Rolls.CONTROL] = Field(
        default=CanarySpec(),
        description="The canary slice and the evidence it must produce before promotion.",
    )

    acknowledged_known_issues: Annotated[tuple[KnownIssueId, ...], Rolls.CONTROL] = Field(
        default=(),
        max_length=32,
        description="Ids of known-bad combinations of the pinned engine "
        "([known issues](known-issues.md)) this deployment runs anyway, e.g. on an image "
        "that carries the fix.  A spec matching an entry not listed here is refused.  "
        "Acknowledging changes nothing the engines run.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )

    @model_validator(mode="after")
    def _engine_supports_flags(self, info: ValidationInfo) -> DSV4DeploymentSpec:
        if self.features.hicache.size_gb is not None:
            raise ValueError(_NO_HICACHE_SIZE)
        refusal = sglang_index_dtype_error(self.features.index_dtype)
        if self.engine is Backend.SGLANG and refusal is not None:
            raise ValueError(f"features.{refusal}")
        if not (info.context or {}).get(REVISION_ADMITTED):
            known = known_issues.refusal(self.model_dump(mode="json", by_alias=True))
            if known is not None:
                raise known
        return self

    def named_devices(self) -> list[tuple[str, str]]:
        """Every device resource the spec names, with its field (what the device allow-list,
        `api.allowed`, judges and names in a refusal)."""
        return [
            (f"spec.{role.value}.resources.rdma.resourceName", rdma.resource_name)
            for role in Role
            if (rdma := self.role_spec(role).resources.rdma) is not None
        ]

    def named_images(self) -> list[tuple[str, str]]:
        """Every image the spec names, with its field (what the image allow-list,
        `api.allowed`, judges and names in a refusal)."""
        images = [("spec.image.name", self.image.name)]
        if self.router.image is not None:
            images.append(("spec.router.image", self.router.image))
        return images

    def role_spec(self, role: Role) -> RoleSpec:
        """The section of one engine role: what rendering, sizing and status read per role."""
        return self.prefill if role is Role.PREFILL else self.decode

    @property
    def multinode(self) -> bool:
        """A role spans several nodes per replica (its workers' StatefulSet has the longest
        name: what `api.names` budgets the deployment's own name for)."""
        return any(self.role_spec(role).nodes_per_replica > 1 for role in Role)
