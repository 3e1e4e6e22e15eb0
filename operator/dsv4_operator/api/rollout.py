"""Typed `spec.rollout`, `spec.canary` and `status.rollout`: the canary rollout's contract.

`status.rollout` is the rollout's whole memory.  Every step is recorded there before it is
acted on, so an operator restarted at any point reads where it was and resumes: it never
starts a second canary and never loses a verdict.
"""

from __future__ import annotations

import hashlib
import json
from enum import StrEnum

from pydantic import Field

from dsv4_engine.features import CamelModel, EngineFeatures, Role
from dsv4_engine.probe.settings import ProbeName


class RolloutSpec(CamelModel):
    """How a passed canary is promoted to the stable workloads."""

    order: tuple[Role, ...] = Field(
        default=(Role.DECODE, Role.PREFILL),
        min_length=1,
        max_length=2,
        description="Roles promoted one after another, in this order (default decode first).",
    )
    max_unavailable: int = Field(
        default=1, ge=1, le=1024, description="Replicas of a role that may be down at once."
    )
    stable_probe_interval_seconds: int = Field(
        default=600,
        ge=0,
        le=86400,
        description="After promotion, probe the stable deployment at low rate this often (0: never).",
    )


class CanarySpec(CamelModel):
    """The canary slice and the evidence it must produce before promotion."""

    prefill_replicas: int = Field(default=1, ge=1, le=64)
    decode_replicas: int = Field(default=1, ge=1, le=64)
    probes: tuple[ProbeName, ...] | None = Field(
        default=None,
        max_length=8,
        description="Probe kinds to run; unset picks the set for the engine backend.",
    )
    requests: int = Field(default=400, ge=10, le=100000, description="Most requests per probe run.")
    concurrency: int = Field(default=64, ge=1, le=1024)
    max_corruption_rate: float = Field(default=0.005, gt=0, lt=1)
    confidence: float = Field(default=0.95, gt=0.5, lt=1)
    ready_timeout_seconds: int = Field(default=900, ge=10, le=86400)
    probe_timeout_seconds: int = Field(default=900, ge=10, le=86400)


class FlagSet(CamelModel):
    """What a rollout changes: the engine feature flags and the engine image."""

    features: EngineFeatures
    image: str

    @property
    def revision(self) -> str:
        body = json.dumps(self.model_dump(mode="json", by_alias=True), sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:10]


class RolloutPhase(StrEnum):
    IDLE = "Idle"  # production runs the spec's flags
    CANARY_STARTING = "CanaryStarting"  # canary slice applied, waiting for it to be Ready
    PROBING = "Probing"  # corruption probes running against the canary
    PROMOTING = "Promoting"  # verdict PASS: stable roles roll to the new flags in order
    ROLLED_BACK = "RolledBack"  # verdict FAIL / INCONCLUSIVE / aborted: stable flags kept


class RolloutVerdict(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"
    ABORTED = "ABORTED"
    MANUAL_PROMOTE = "MANUAL_PROMOTE"


class RolloutStatus(CamelModel):
    phase: RolloutPhase = RolloutPhase.IDLE
    stable: FlagSet
    stable_revision: str
    canary: FlagSet | None = None
    canary_revision: str | None = None
    started_at: str | None = None
    phase_since: str | None = None
    probe_attempt: int = Field(default=0, ge=0)
    promoted_roles: tuple[Role, ...] = ()
    verdict: RolloutVerdict | None = None
    rate: float | None = None
    bound: float | None = None
    samples: int | None = None
    report: str | None = Field(default=None, description="ConfigMap holding the JSON report.")
    rejected_revision: str | None = Field(
        default=None,
        description="Flags that failed their canary: not retried while the spec asks for them, "
        "until the spec changes or someone asks for a retry (sticky reject).",
    )
    stable_probe_at: str | None = Field(
        default=None, description="When the stable deployment was last probed."
    )
    stable_probe_verdict: RolloutVerdict | None = None
    handled_retry: str | None = Field(
        default=None, description="The last retry annotation value already acted on."
    )
    message: str = ""
