"""`DSV4Deployment.status`: what the operator observed, written only by the operator."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import Field

from dsv4_engine.features import CamelModel, EngineFeatures


class Phase(StrEnum):
    PROGRESSING = "Progressing"
    READY = "Ready"
    DEGRADED = "Degraded"


class ConditionType(StrEnum):
    READY = "Ready"
    PROGRESSING = "Progressing"
    DEGRADED = "Degraded"
    # kstatus' abnormal-true pair, which Flux and `kubectl wait`-style tools read: the
    # same facts as Progressing and Degraded, under the names they look for.
    RECONCILING = "Reconciling"
    STALLED = "Stalled"


class Condition(CamelModel):
    type: ConditionType
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(max_length=1024)
    message: str = Field(default="", max_length=32768)
    last_transition_time: str = Field(description="RFC 3339 time the status last changed.")
    observed_generation: int | None = None


class RoleStatus(CamelModel):
    desired: int = 0
    ready: int = 0
    updated: int = 0
    summary: str = Field(default="0/0", description="ready/desired replicas (printer column).")
    selector: str | None = Field(
        default=None,
        description="Label selector of the role's serving pods (its replicas' node-rank-0 "
        "pods, both slots): the scale subresource's selector, which a HorizontalPodAutoscaler "
        "uses to read their metrics.",
    )


class DSV4DeploymentStatus(CamelModel):
    observed_generation: int | None = None
    phase: Phase | None = None
    # A map keyed by type, so a server-side apply merges conditions by type.
    conditions: tuple[Condition, ...] = Field(
        default=(),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    prefill: RoleStatus | None = None
    decode: RoleStatus | None = None
    router: RoleStatus | None = None
    engine_revision: str | None = Field(
        default=None,
        description="The engine revision the stable children run (status.rollout.stableRevision): "
        "every revision-class field of the spec, proven by a canary (docs/rollout.md).",
    )
    active_features: EngineFeatures | None = Field(
        default=None, description="The engine feature flags the children run."
    )
    last_progress_time: str | None = Field(
        default=None,
        description="While not Ready: when the roles last made progress (a new spec applied, "
        "more replicas ready or updated).  spec.progressDeadlineSeconds counts from here.",
    )
    rollout: dict[str, Any] | None = Field(
        default=None, description="Canary rollout state (owned by the rollout controller)."
    )
