"""The engine feature flags: one typed model for every place a flag appears.

`spec.features` of the DSV4Deployment CRD, the engine ConfigMap the operator renders,
the `engine.yaml` read by `dsv4-engine launch` and the reference engine's flags are all
this model, so a flag cannot mean two things in two places.  Pure pydantic: the operator
imports it without torch.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel


class IndexDtype(StrEnum):
    """Storage format of the lightning indexer's keys (index-K)."""

    FP8 = "fp8"
    BF16 = "bf16"
    FP4 = "fp4"


class HiCacheWritePolicy(StrEnum):
    WRITE_BACK = "write_back"
    WRITE_THROUGH = "write_through"
    WRITE_THROUGH_SELECTIVE = "write_through_selective"


class HiCacheMemLayout(StrEnum):
    LAYER_FIRST = "layer_first"
    PAGE_FIRST = "page_first"
    PAGE_FIRST_DIRECT = "page_first_direct"


class KvCanary(StrEnum):
    """SGLang's in-engine KV integrity check (`--kv-canary`)."""

    OFF = "off"
    LOG = "log"
    RAISE = "raise"


class Role(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"


class CamelModel(BaseModel):
    """Fields are snake_case in Python and camelCase on the wire (CRD, YAML, JSON)."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class HiCacheFeature(CamelModel):
    """Hierarchical cache: a host-memory tier behind the device KV pools."""

    # The same rule as `_needs_a_size`, for the API server (the CRD is generated from this).
    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!self.enabled || has(self.ratio) || has(self.sizeGB)",
                    "message": "hicache.enabled needs hicache.ratio (> 1) or hicache.sizeGB",
                    "fieldPath": ".enabled",
                }
            ]
        }
    )

    enabled: bool = False
    ratio: float | None = Field(
        default=None, gt=1, description="Host pool size as a multiple of the device pool."
    )
    size_gb: int | None = Field(
        default=None,
        gt=0,
        alias="sizeGB",
        description="Host pool size in GiB per rank (overrides ratio).",
    )
    write_policy: HiCacheWritePolicy = HiCacheWritePolicy.WRITE_THROUGH
    mem_layout: HiCacheMemLayout = HiCacheMemLayout.PAGE_FIRST
    roles: tuple[Role, ...] = Field(default=(Role.PREFILL, Role.DECODE), max_length=2)

    @model_validator(mode="after")
    def _needs_a_size(self) -> HiCacheFeature:
        if self.enabled and self.ratio is None and self.size_gb is None:
            raise ValueError("hicache.enabled needs hicache.ratio (> 1) or hicache.sizeGB")
        return self


class FaultInjection(CamelModel):
    """Demo and test only: re-creates the seed incident on purpose.

    Honoured by the CPU reference engine alone (`backend: reference`); `dsv4-engine launch`
    refuses it for SGLang.  It is part of the flags, so turning it on is itself a rollout —
    which is how the demo shows a canary catching the corruption it causes.
    """

    ungated_index_k: bool = Field(
        default=False,
        description="Demo only: index-K reads skip the per-layer HiCache gate "
        "(DSV4_INJECT_UNGATED_INDEX_K=1), reproducing the seed's race.",
    )
    ungated_share: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="Demo only, with ungatedIndexK: the share of HiCache loads whose index-K "
        "reads skip the gate (each load draws; 1: every load).  Aims the race's corruption "
        "rate, as timing does on a GPU where only some loads are still copying when read.",
    )
    benign_nondeterminism: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="Test only: the share of prefix-cache hits whose first token the "
        "reference engine's random model takes from the runner-up, as healthy SGLang flips "
        "near-ties (`dsv4-engine serve --benign-nondeterminism`).  Nothing is corrupted, "
        "but the engine is no longer deterministic: a canary's consistency probes are then "
        "judged against the stable's own divergence.",
    )

    @model_serializer(mode="wrap")
    def _recorded_revisions_kept(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """benignNondeterminism came after revisions were recorded, and a revision is a
        hash of the dumped spec: at its default it is left out, so every spec recorded
        before keeps its revision (an operator upgrade must not canary every deployment)."""
        data: dict[str, Any] = handler(self)
        for key in ("benignNondeterminism", "benign_nondeterminism"):
            if data.get(key) == 0:
                del data[key]
        return data

    @property
    def injected(self) -> str | None:
        """The field that injects something, as a message names it; None: nothing is."""
        if self.ungated_index_k:
            return "ungatedIndexK"
        return "benignNondeterminism" if self.benign_nondeterminism else None

    def env_value(self) -> str | None:
        """DSV4_INJECT_UNGATED_INDEX_K for the reference engine: the share, or None (off)."""
        return f"{self.ungated_share:g}" if self.ungated_index_k else None


class EngineFeatures(CamelModel):
    """The flags a rollout changes.  Changing any of them goes through a canary."""

    hicache: HiCacheFeature = HiCacheFeature()
    index_dtype: IndexDtype = IndexDtype.FP8
    kv_canary: KvCanary = KvCanary.OFF
    fault_injection: FaultInjection = FaultInjection()


# What each flag does to the prefill→decode transfer: the KV and index-K pages a prefill
# engine ships to a decode engine for every request.  A flag that changes their format
# means a prefill and a decode engine with different values cannot hand a request over —
# so such a change is never promoted role by role (see docs/rollout.md).  Every field of
# EngineFeatures is classified here; tests/unit/engine/test_engine_config.py keeps it so.
CHANGES_TRANSFER: dict[str, bool] = {
    "hicache": False,  # a host tier behind each engine's own pools: pages travel as they are
    "index_dtype": True,  # index-K rows travel with the KV: fp8 132 B, fp4 68 B, bf16 256 B
    "kv_canary": False,  # integrity hashes kept inside one engine
    "fault_injection": False,  # the reference engine's read gate: the format is unchanged
}


def transfer_contract(features: EngineFeatures) -> dict[str, object]:
    """The flags both ends of a PD transfer must agree on (camelCase, as on the wire)."""
    dumped = features.model_dump(mode="json", by_alias=True)
    fields = EngineFeatures.model_fields
    return {
        fields[name].alias or name: dumped[fields[name].alias or name]
        for name, changes in CHANGES_TRANSFER.items()
        if changes
    }
