"""One rollout step inside a reconcile pass: observe → decide → carry out the canary effects.

The reconciler hands over what it already read (the resource, its parsed spec, the live
canary objects) and gets back the new `status.rollout`, the flags each stable role must
run, and the events to record.  All decisions are `decide`'s; this module only does the
I/O its effects ask for, each of them idempotent.
"""

from __future__ import annotations

import datetime as dt
import logging
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from dsv4_engine.engine_config import Backend
from dsv4_engine.features import Role
from dsv4_engine.probe import ProbeSettings
from dsv4_operator import metrics
from dsv4_operator.api.errors import first_error
from dsv4_operator.api.rollout import (
    CanarySpec,
    FlagSet,
    RolloutPhase,
    RolloutSpec,
    RolloutStatus,
)
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.api.times import parse_stamp
from dsv4_operator.reconcile.plan import plan, with_applied_hash
from dsv4_operator.render import render_all
from dsv4_operator.render.memory import pod_memory
from dsv4_operator.render.meta import Owner
from dsv4_operator.render.router import ROUTER_PORT, router_name
from dsv4_operator.render.workloads import HostMemory
from dsv4_operator.rollout import manual
from dsv4_operator.rollout.decide import (
    Decision,
    Effect,
    Observed,
    ProbeOutcome,
    decide,
    role_flags,
)
from dsv4_operator.rollout.executor import ProbeExecutor
from dsv4_operator.rollout.observe import slice_ready
from dsv4_operator.rollout.reports import (
    outcome_from_config_map,
    report_name,
    report_selector,
    stale_canary_reports,
)
from dsv4_operator.rollout.slices import (
    as_canary,
    canary_owner,
    canary_spec,
    canary_url,
    spec_flags,
)

log = logging.getLogger("dsv4_operator.rollout")
T = TypeVar("T", bound=BaseModel)

# (namespace, service, port) → base URL the operator can reach.
ServiceUrl = Callable[[str, str, int], str]


def cluster_service_url(namespace: str, service: str, port: int) -> str:
    return f"http://{service}.{namespace}.svc:{port}"


@dataclass(frozen=True)
class RolloutOutcome:
    status: RolloutStatus
    flags: dict[Role, FlagSet]  # what each stable role must run now
    events: tuple[tuple[str, str, str], ...]


@dataclass
class RolloutController:
    """Holds what outlives a pass: the probe tasks and how to reach a Service.

    ``service_url`` is how the operator reaches a Service (the canary's warm-up check);
    ``probe_url`` how the probes do, when they run elsewhere (a Job in the cluster)."""

    kube: Any
    executor: ProbeExecutor
    service_url: ServiceUrl = cluster_service_url
    probe_url: ServiceUrl | None = None
    backend: Backend = Backend.SGLANG
    host_memory: HostMemory = pod_memory

    def step(
        self,
        owner: Owner,
        obj: dict[str, Any],
        spec: DSV4DeploymentSpec,
        previous: RolloutStatus | None,
        canary_live: list[dict[str, Any]],
        rolled: frozenset[Role],
        now: dt.datetime,
    ) -> RolloutOutcome:
        canary_cfg = _section(CanarySpec, "canary", spec.canary)
        rollout_cfg = _section(RolloutSpec, "rollout", spec.rollout)
        desired = spec_flags(spec)
        canary_objects = self._canary_objects(owner, spec, previous, canary_cfg)
        canary_report = _canary_report(owner, previous)
        stable_report = _stable_report(owner, previous)
        # Readiness only decides anything while the canary starts; the warm-up request is a
        # network call, not to be made on every pass of a probe or a promotion.
        starting = previous is not None and previous.phase is RolloutPhase.CANARY_STARTING
        observed = Observed(
            now=now,
            canary_ready=starting
            and bool(canary_objects)
            and slice_ready(canary_objects, canary_live)
            and self._warm(owner),
            probe=self._report_outcome(owner, canary_report),
            probe_running=canary_report is not None and self.executor.running(owner, canary_report),
            stable_probe=self._report_outcome(owner, stable_report),
            stable_probe_running=stable_report is not None
            and self.executor.running(owner, stable_report),
            rolled=rolled,
            manual=manual.parse(obj["metadata"].get("annotations")),
        )
        decision = decide(desired, previous, observed, canary_cfg, rollout_cfg)
        same_canary = previous is not None and decision.status.canary == previous.canary
        rendered = canary_objects if same_canary else None
        self._carry_out(
            owner, spec, canary_report, stable_report, decision, canary_cfg, canary_live, rendered
        )
        status = decision.status
        since = parse_stamp(status.phase_since) if status.phase_since else None
        metrics.record_phase(
            owner.namespace, owner.name, status.phase, since.timestamp() if since else 0.0
        )
        flags = {role: role_flags(status, role) for role in Role}
        return RolloutOutcome(status, flags, decision.events)

    # -- effects -------------------------------------------------------------------------
    def _carry_out(
        self,
        owner: Owner,
        spec: DSV4DeploymentSpec,
        previous_canary_report: str | None,
        previous_stable_report: str | None,
        decision: Decision,
        canary_cfg: CanarySpec,
        canary_live: list[dict[str, Any]],
        rendered_canary: list[dict[str, Any]] | None,
    ) -> None:
        """``rendered_canary``: the canary objects already rendered for this status, if any."""
        status = decision.status
        for effect in decision.effects:
            if effect is Effect.APPLY_CANARY:
                desired = rendered_canary
                if desired is None:
                    desired = self._canary_objects(owner, spec, status, canary_cfg)
                for action in plan(desired, canary_live):
                    if action.verb == "apply":
                        self.kube.apply(action.obj)
                    else:
                        self.kube.delete(action.kind, owner.namespace, action.name)
            elif effect is Effect.DELETE_CANARY:
                for obj in canary_live:
                    self.kube.delete(obj["kind"], owner.namespace, obj["metadata"]["name"])
            elif effect is Effect.START_PROBE:
                service, port = canary_url(owner)
                self.executor.start(
                    owner,
                    _canary_report(owner, status),
                    "canary",
                    self._settings(self._probe_url(owner.namespace, service, port), canary_cfg),
                )
                self._prune_reports(owner)
            elif effect is Effect.STOP_PROBE and previous_canary_report is not None:
                self.executor.stop(owner, previous_canary_report)
            elif effect is Effect.START_STABLE_PROBE:
                self._probe_stable(owner, previous_stable_report, status, canary_cfg)

    def _probe_stable(
        self,
        owner: Owner,
        previous_report: str | None,
        status: RolloutStatus,
        canary_cfg: CanarySpec,
    ) -> None:
        """A low-rate probe of production.  Only the latest report is kept: its verdict is
        already in status.rollout.stableProbeVerdict."""
        if previous_report is not None:
            self.kube.delete("ConfigMap", owner.namespace, previous_report)
        try:
            url = self._probe_url(owner.namespace, router_name(owner), ROUTER_PORT)
        except ValueError as err:
            log.warning("stable probe of %s/%s skipped: %s", owner.namespace, owner.name, err)
            return
        low_rate = canary_cfg.model_copy(update={"concurrency": 4, "requests": 50})
        self.executor.start(
            owner, _stable_report(owner, status), "stable", self._settings(url, low_rate)
        )

    def _prune_reports(self, owner: Owner) -> None:
        reports = self.kube.list("ConfigMap", owner.namespace, report_selector(owner))
        for name in stale_canary_reports(owner, reports):
            self.kube.delete("ConfigMap", owner.namespace, name)

    # -- observations --------------------------------------------------------------------
    def _canary_objects(
        self,
        owner: Owner,
        spec: DSV4DeploymentSpec,
        status: RolloutStatus | None,
        canary_cfg: CanarySpec,
    ) -> list[dict[str, Any]]:
        if status is None or status.canary is None:
            return []
        cspec = canary_spec(spec, status.canary, canary_cfg)
        rendered = render_all(canary_owner(owner), cspec, self.host_memory)
        return [with_applied_hash(o) for o in as_canary(owner, rendered)]

    def _warm(self, owner: Owner) -> bool:
        """A canary is Ready only once its router answers: the probes' first request must not
        be the one that finds out the endpoint is not there yet."""
        service, port = canary_url(owner)
        try:
            url = self.service_url(owner.namespace, service, port)
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                return response.status == 200
        except (OSError, ValueError) as err:
            log.info("canary of %s/%s not answering yet: %s", owner.namespace, owner.name, err)
            return False

    def _report_outcome(self, owner: Owner, report: str | None) -> ProbeOutcome | None:
        if report is None:
            return None
        config_map = self.kube.get("ConfigMap", owner.namespace, report)
        return outcome_from_config_map(config_map) if config_map else None

    def _probe_url(self, namespace: str, service: str, port: int) -> str:
        return (self.probe_url or self.service_url)(namespace, service, port)

    def _settings(self, url: str, canary_cfg: CanarySpec) -> ProbeSettings:
        return ProbeSettings(
            base_url=url,
            backend=self.backend,
            probes=canary_cfg.probes or (),
            concurrency=canary_cfg.concurrency,
            requests=canary_cfg.requests,
            max_corruption_rate=canary_cfg.max_corruption_rate,
            confidence=canary_cfg.confidence,
            max_duration_s=float(canary_cfg.probe_timeout_seconds),
        )


class RolloutSpecError(ValueError):
    """spec.canary or spec.rollout does not parse; the message names the field."""


def _section(model: type[T], name: str, raw: dict[str, Any] | None) -> T:
    try:
        return model.model_validate(raw or {})
    except ValidationError as err:
        raise RolloutSpecError(first_error(err, name)) from None


def _canary_report(owner: Owner, status: RolloutStatus | None) -> str | None:
    """The report of the current canary probe attempt; None before the first attempt."""
    if status is None or status.canary_revision is None or status.probe_attempt == 0:
        return None
    return report_name(owner, "canary", status.canary_revision, status.probe_attempt)


def _stable_report(owner: Owner, status: RolloutStatus | None) -> str | None:
    """The report of the latest low-rate probe of production; None before the first one."""
    if status is None or status.stable_probe_at is None:
        return None
    started = status.stable_probe_at.replace(":", "").replace("-", "").lower()
    return f"{report_name(owner, 'stable', status.stable_revision, 0)}-{started}"
