"""Typed `spec.rollout`, `spec.canary` and `status.rollout`: the canary rollout's contract.

`status.rollout` is the rollout's memory.  Every step is recorded there before it is acted
on, so an operator restarted at any point reads where it was and resumes: it never starts a
second canary and never loses a verdict.  Losing it (a restore without status, a hand edit)
does not turn the gate off: the stable flags are also recorded on the children, and the
rollout is rebuilt from them and the report ConfigMaps (`rollout.recover`), never from the
spec.
"""

from __future__ import annotations

import hashlib
import json
from enum import StrEnum
from typing import Any

from pydantic import ConfigDict, Field, field_validator, model_validator

from dsv4_engine.engine_config import Backend
from dsv4_engine.features import CamelModel, EngineFeatures, Role
from dsv4_engine.probe.settings import ProbeName
from dsv4_engine.probe.stats import MAX_REQUESTS, can_pass, minimum_samples
from dsv4_operator.api.canary_rule import requests_can_pass_rule
from dsv4_operator.api.schema import validations

# Bounds of a device KV pool cap (`--max-total-tokens`), in tokens.
MIN_POOL_TOKENS = 1024
MAX_POOL_TOKENS = 1 << 30
# The canary's HiCache roles' device pool when `spec.canary.devicePoolTokens` is unset:
# small enough that the probe's prompts (about 0.7-0.8 M unique tokens on SGLang, a few
# hundred thousand on the reference engine) evict prefixes to the host tier and read them
# back, large enough to hold a batch of the probe's concurrency (docs/rollout.md, "Reading
# from the host tier").
CANARY_DEVICE_POOL_TOKENS = {Backend.SGLANG: 65536, Backend.REFERENCE: 32768}


class Promotion(StrEnum):
    """How passed flags replace the stable ones (`rollout.pairs`)."""

    # New prefill+decode pairs grow in the other slot before old ones go: never fewer Ready
    # serving replicas than the spec's, at the cost of one extra pair of GPUs at a time.
    SURGE = "Surge"
    # Each role's StatefulSet replaces its own pods, one at a time, in `order`: no spare GPU,
    # but a role of one replica serves nothing while its new pod starts (an outage).
    IN_PLACE = "InPlace"


class RolloutSpec(CamelModel):
    """How a passed canary is promoted, and how production is watched afterwards."""

    promotion: Promotion = Field(
        default=Promotion.SURGE,
        description="Surge (default): the new flags grow in the other slot one prefill+decode "
        "pair at a time and an old pair goes only once a new one serves, so no role ever has "
        "fewer Ready serving replicas than the spec asks for; needs GPUs for one extra pair "
        "(the canary's, freed when promotion starts).  InPlace: each role's pods are replaced "
        "where they run, in `order`, with no spare GPU — a role with replicas 1 then serves "
        "NOTHING while its new pod loads weights and compiles (minutes on B200s: an outage "
        "for every user of the deployment).  A change of the prefill→decode transfer format "
        "is always promoted in pairs (a prefill of one format never feeds a decode of the "
        "other), whatever this says.",
    )
    order: tuple[Role, ...] = Field(
        default=(Role.DECODE, Role.PREFILL),
        min_length=1,
        max_length=2,
        description="promotion InPlace only: roles promoted one after another, in this order "
        "(default decode first); a role left out is promoted last.",
    )
    promotion_timeout_seconds: int = Field(
        default=3600,
        ge=60,
        le=7 * 86400,
        description="A promotion that has not rolled every role within this many seconds is "
        "rolled back (the roles already promoted return to the stable flags) and its flags "
        "are rejected; raise it for roles with many replicas or slow engine start-up.",
    )
    stable_probe_interval_seconds: int = Field(
        default=600,
        ge=0,
        le=86400,
        description="Watch production: probe the stable deployment this often, after a "
        "promotion and after a rollback alike (0: never).  The watch only raises an alarm — "
        "a watch run that finds corruption sets Degraded (StableCorruption) and fires an "
        "alert — and never proves flags clean: it is too small to PASS.",
    )
    stable_probe_requests: int = Field(
        default=50,
        ge=10,
        le=MAX_REQUESTS,
        description="Samples per production watch run (kept small: it is load on production).",
    )
    stable_probe_concurrency: int = Field(
        default=4, ge=1, le=1024, description="Requests in flight during a production watch run."
    )
    revision_history_limit: int = Field(
        default=5,
        ge=1,
        le=20,
        description="Promoted revisions kept in status.rollout.history (the one serving "
        "included), each with its image digest, when it was promoted and what the production "
        "watch found while it served: what `dsv4ctl rollout undo` can return to.",
    )


class CanarySpec(CamelModel):
    """The canary slice and the evidence it must produce before its flags are promoted."""

    model_config = validations(requests_can_pass_rule())

    prefill_replicas: int = Field(
        default=1, ge=1, le=64, description="Prefill replicas of the canary slice."
    )
    decode_replicas: int = Field(
        default=1, ge=1, le=64, description="Decode replicas of the canary slice."
    )
    probes: tuple[ProbeName, ...] | None = Field(
        default=None,
        max_length=8,
        description="Probe kinds to run; unset picks the set for spec.engine.",
    )
    requests: int | None = Field(
        default=None,
        ge=1,
        le=MAX_REQUESTS,
        description="Judged samples a probe run collects.  Unset: the fewest that can PASS at "
        "maxCorruptionRate and confidence (598 at the defaults), the same rule as "
        "`dsv4ctl probe`; a value below that minimum is refused, since no engine could pass.",
    )
    concurrency: int = Field(
        default=64,
        ge=1,
        le=1024,
        description="Requests in flight; PASS needs the canary to have carried this many.",
    )
    max_corruption_rate: float = Field(
        default=0.005,
        gt=0,
        lt=1,
        description="Corruption budget: PASS needs the exact upper bound of the corruption "
        "rate below it; FAIL is declared as soon as the rate is shown above it.",
    )
    confidence: float = Field(
        default=0.95,
        gt=0.5,
        lt=1,
        description="Confidence of both decisions (one-sided, exact Clopper-Pearson bounds).",
    )
    ready_timeout_seconds: int = Field(
        default=900,
        ge=10,
        le=86400,
        description="A canary not Ready (and answering) within this long is INCONCLUSIVE.",
    )
    placement_timeout_seconds: int = Field(
        default=30,
        ge=0,
        le=86400,
        description="A canary pod the scheduler cannot place (Unschedulable) waits in phase "
        "CanaryPending this long, then the canary ends NoCapacity: its slice is deleted, its "
        "flags are NOT rejected, and it is tried again when a GPU node is added (or after a "
        "backoff, 5 minutes doubling to an hour).  A canary pod its controller cannot create "
        "(FailedCreate: a quota, an admission refusal) this long ends INCONCLUSIVE with "
        "Kubernetes' reason.  Neither waits out readyTimeoutSeconds.  Raise it where a "
        "cluster autoscaler adds nodes for pending pods.",
    )
    probe_timeout_seconds: int = Field(
        default=900,
        ge=10,
        le=86400,
        description="A probe run without a verdict within this long is INCONCLUSIVE.",
    )
    device_pool_tokens: int | None = Field(
        default=None,
        ge=MIN_POOL_TOKENS,
        le=MAX_POOL_TOKENS,
        description="The device KV pool of the canary's HiCache roles, in tokens (SGLang "
        "`--max-total-tokens`): a pool smaller than the probe's prompts makes the engine "
        "evict prefixes to its host tier and read them back, the path a HiCache change "
        "alters; a PASS needs such reads.  It changes the canary's capacity, never its "
        "flags or the pages' layout, and production never runs it.  Unset: "
        f"{CANARY_DEVICE_POOL_TOKENS[Backend.SGLANG]} on SGLang, "
        f"{CANARY_DEVICE_POOL_TOKENS[Backend.REFERENCE]} on the reference engine.",
    )

    def pool_tokens(self, backend: Backend) -> int:
        """The canary's device pool cap for ``backend`` (`device_pool_tokens` or its default)."""
        return self.device_pool_tokens or CANARY_DEVICE_POOL_TOKENS[backend]

    @property
    def sample_count(self) -> int:
        """The judged samples a run collects: `requests`, or the fewest that can PASS."""
        return self.requests or minimum_samples(self.max_corruption_rate, self.confidence)

    @model_validator(mode="after")
    def _can_pass(self) -> CanarySpec:
        least = minimum_samples(self.max_corruption_rate, self.confidence)
        asked = self.requests or MAX_REQUESTS
        if not can_pass(asked, self.max_corruption_rate, self.confidence):
            shown = f"more than {MAX_REQUESTS}" if least > MAX_REQUESTS else str(least)
            raise ValueError(
                f"requests: {self.requests or 'the default'} can never PASS at "
                f"maxCorruptionRate {self.max_corruption_rate} and confidence "
                f"{self.confidence}: the minimum is {shown}"
            )
        return self


class EngineRevision(CamelModel):
    """What a rollout changes: the engine revision, every field of the spec whose class is
    `Rolls.REVISION` (`api.rolls`: model, engine, image, features, parallelism, extraArgs,
    env, disaggregation, router policy and image), as the spec writes them.  A canary proves
    exactly this; production runs exactly what a canary proved.

    ``transfer_key`` is derived from both roles' resolved engine configuration
    (`render.transfer`): engines of equal keys can hand requests over, others cannot.
    ``image_digest`` is the registry digest the canary's engine pods ran, recorded at its
    PASS: production is pinned to it, so a tag that moves later changes nothing there.
    Neither is part of `revision`, which names what the spec asks for."""

    spec: dict[str, Any] = Field(description="The spec's revision-class fields.")
    transfer_key: str = Field(
        description="Prefill→decode wire format of both roles' resolved engine configuration."
    )
    image_digest: str | None = Field(
        default=None,
        description="The engine image as `repository@sha256:…`, as the canary ran it; "
        "production runs this reference (unset: the runtime reported no registry digest).",
    )

    @field_validator("spec")
    @classmethod
    def _canonical(cls, spec: dict[str, Any]) -> dict[str, Any]:
        """The spec as the API server gives it back: a whole float (`1.0`) as an integer,
        and every object's keys in sorted order.  The revision, a hash of this JSON, must
        not move with the first; the renders a pass keeps (`reconcile.desired.RenderMemory`,
        keyed by the rollout status's JSON) must not miss on the second."""
        return _as_stored(spec)

    @property
    def revision(self) -> str:
        return _digest(self.spec)

    @property
    def features(self) -> EngineFeatures:
        return EngineFeatures.model_validate(self.spec.get("features") or {})

    @property
    def image(self) -> str:
        """The engine image as the spec names it (a tag, usually)."""
        return str(self.spec["image"]["name"])

    @property
    def pinned_image(self) -> str:
        """What production's engine containers run: the digest once proven, else the name."""
        return self.image_digest or self.image


def _as_stored(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _as_stored(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_as_stored(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _digest(body: object) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:10]


class RolloutPhase(StrEnum):
    IDLE = "Idle"  # production runs the spec's flags
    CANARY_STARTING = "CanaryStarting"  # canary slice applied, waiting for it to be Ready
    # The scheduler cannot place the canary: waiting for capacity, never a verdict on flags.
    CANARY_PENDING = "CanaryPending"
    PROBING = "Probing"  # corruption probes running against the canary
    PROMOTING = "Promoting"  # verdict PASS: stable engines move to the new flags
    ROLLED_BACK = "RolledBack"  # verdict FAIL / INCONCLUSIVE / aborted: stable flags kept


# The phases of a rollout under way: no other starts, no undo, until it ends.
IN_PROGRESS = (
    RolloutPhase.CANARY_STARTING,
    RolloutPhase.CANARY_PENDING,
    RolloutPhase.PROBING,
    RolloutPhase.PROMOTING,
)


class RolloutVerdict(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"
    ABORTED = "ABORTED"
    MANUAL_PROMOTE = "MANUAL_PROMOTE"
    # A person returned production to a revision that was promoted before and served
    # without a corruption finding (`dsv4ctl rollout undo`): no canary, it was proven.
    UNDO = "UNDO"
    # The canary could not be placed within spec.canary.placementTimeoutSeconds: capacity
    # failed, not the flags, which are not rejected and are tried again (`rollout.decide`).
    NO_CAPACITY = "NoCapacity"
    PROMOTION_TIMEOUT = "PROMOTION_TIMEOUT"


class Slot(StrEnum):
    """Where a deployment's stable engines live.  Normally all in one slot; while a change
    of the prefill→decode transfer format is promoted, the old flags in one slot and the
    new in the other, each slot with its own router, so no request crosses formats.  `blue`
    keeps the names a deployment always had (`<name>-decode`); `green` adds a suffix
    (`<name>-decode-green`)."""

    BLUE = "blue"
    GREEN = "green"

    @property
    def suffix(self) -> str:
        return "" if self is Slot.BLUE else f"-{self.value}"

    @property
    def other(self) -> Slot:
        return Slot.GREEN if self is Slot.BLUE else Slot.BLUE


class Transfer(StrEnum):
    """How the flags of a rollout relate to the stable ones' prefill→decode transfer format
    (`EngineRevision.transfer_key`), which decides whether they may be promoted in place."""

    COMPATIBLE = "compatible"  # same format: a prefill may feed any decode (InPlace allowed)
    INCOMPATIBLE = "incompatible"  # another format: in prefill+decode pairs, never mixed


class PairStage(StrEnum):
    """Where one step of a paired promotion is (see `rollout.pairs`)."""

    GROW = "Grow"  # the new slot takes one more prefill+decode pair
    RETIRE = "Retire"  # the old slot's router leaves before its last pair does
    SHRINK = "Shrink"  # the old slot gives one pair back


class WatchVerdict(StrEnum):
    """What one production watch run (the periodic probe of the stable slice) can say.

    A watch run is small (`spec.rollout.stableProbeRequests`), so it can show corruption
    but never prove its absence: there is no PASS here."""

    CORRUPT = "Corrupt"  # the canary's FAIL rule fired: corruption above maxCorruptionRate
    CLEAN = "NoCorruptionSeen"  # samples were judged and the FAIL rule did not fire
    NO_EVIDENCE = "NoEvidence"  # nothing judged (router unreachable, probe could not run)


class StatusModel(CamelModel):
    """Status is read back from the API: fields a newer operator wrote are ignored, not an
    error (a downgrade or an upgrade must not make the rollout's memory unreadable)."""

    model_config = ConfigDict(extra="ignore")


class StableProbeStatus(StatusModel):
    """The production watch: the run started last, and what the last finished run found
    (kept while the next one runs, so a Corrupt finding stays visible until disproved)."""

    started_at: str = Field(description="When the latest watch run started.")
    verdict: WatchVerdict | None = Field(
        default=None, description="What the last finished run found (no PASS: see WatchVerdict)."
    )
    verdict_of: str | None = Field(
        default=None, description="startedAt of the run the verdict is from."
    )
    samples: int | None = None
    corrupt: int | None = None
    message: str = ""

    @property
    def pending(self) -> bool:
        """The latest run has not reported yet."""
        return self.verdict_of != self.started_at


class PromotedRevision(StatusModel):
    """One revision that served production (`status.rollout.history`): what `dsv4ctl rollout
    undo` may return to, and why it may or may not."""

    flags: EngineRevision = Field(description="The revision, with the image digest it ran.")
    promoted_at: str = Field(description="When it began to serve (promoted, or adopted).")
    verdict: RolloutVerdict | None = Field(
        default=None,
        description="How it came to serve: PASS, MANUAL_PROMOTE or UNDO; unset for the "
        "revision a new deployment started with.",
    )
    report: str | None = Field(default=None, description="The canary report of its PASS.")
    retired_at: str | None = Field(default=None, description="When another replaced it.")
    watch_runs: int = Field(
        default=0, ge=0, description="Production watch runs that judged samples while it served."
    )
    corruption: str | None = Field(
        default=None,
        description="What a production watch run found while it served, if it found "
        "corruption: such a revision is never returned to by undo.",
    )

    @property
    def revision(self) -> str:
        return self.flags.revision


class RolloutStatus(StatusModel):
    phase: RolloutPhase = RolloutPhase.IDLE
    stable: EngineRevision
    stable_revision: str
    canary: EngineRevision | None = None
    canary_revision: str | None = None
    transfer: Transfer | None = Field(
        default=None,
        description="Whether the flags under test keep the stable flags' prefill→decode "
        "transfer format (compatible) or not (incompatible: only ever promoted in pairs, so "
        "no request crosses formats).",
    )
    promotion: Promotion | None = Field(
        default=None,
        description="How the promotion under way (or the last one) replaces the stable "
        "engines: Surge (pairs in the other slot) or InPlace (role by role, in the slot).",
    )
    slot: Slot = Field(
        default=Slot.BLUE, description="The slot whose engines run the stable flags."
    )
    pair_step: int = Field(
        default=0,
        ge=0,
        description="A paired promotion's progress: prefill+decode pairs moved to the new "
        "slot (0 when none is under way).",
    )
    pair_stage: PairStage | None = None
    retiring: Slot | None = Field(
        default=None,
        description="A slot being emptied after a paired promotion was rolled back: its "
        "router leaves first, then its engines.",
    )
    started_at: str | None = None
    phase_since: str | None = None
    probe_attempt: int = Field(
        default=0,
        ge=0,
        description="Probe attempts started by this deployment, ever: each attempt files a "
        "report under a new number, so no attempt can read an earlier rollout's report.",
    )
    promoted_roles: tuple[Role, ...] = ()
    verdict: RolloutVerdict | None = None
    rate: float | None = None
    bound: float | None = None
    samples: int | None = None
    report: str | None = Field(default=None, description="ConfigMap holding the JSON report.")
    verdict_reason: str | None = Field(
        default=None,
        description="Why the verdict was reached, kept while later passes rewrite `message` "
        "(a canary that could not be placed: Kubernetes' words).",
    )
    rejected_revision: str | None = Field(
        default=None,
        description="Flags that failed their canary: not retried while the spec asks for them, "
        "until the spec changes or someone asks for a retry (sticky reject).",
    )
    handled_action: str | None = Field(
        default=None,
        description="Token of the last rollout-action annotation acted on or refused: a "
        "control acts once; the annotation stays (the operator never writes the resource) "
        "until the next `dsv4ctl rollout` overwrites it, and a control with this token is "
        "never acted on again.",
    )
    stable_probe: StableProbeStatus | None = Field(
        default=None, description="The latest production watch run."
    )
    capacity_nodes: int | None = Field(
        default=None,
        description="NoCapacity: the GPU nodes the cluster had when the canary found no room; "
        "a node added retries it at once.",
    )
    capacity_attempts: int = Field(
        default=0, ge=0, description="Canaries of these flags in a row that found no capacity."
    )
    retry_at: str | None = Field(
        default=None, description="NoCapacity: when the canary is tried again without a new node."
    )
    history: tuple[PromotedRevision, ...] = Field(
        default=(),
        description="The revisions that served production, newest (the serving one) first, "
        "at most spec.rollout.revisionHistoryLimit.",
    )
    message: str = ""
