"""The rollout's I/O around `decide`: what it observes before a decision, and the probe
effects it carries out after the reconciler has recorded that decision in the status.

The reconciler owns the pass (`reconcile.reconciler`): it reads the world once, asks this
module to observe, decides, writes the status, plans the stable and canary children together
and applies them through its one write path, then calls `carry_out`.  Nothing here writes a
child or the status; everything here is idempotent.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from dsv4_engine.engine_config import Backend
from dsv4_engine.features import KvCanary
from dsv4_engine.probe import ProbeSettings
from dsv4_engine.probe.settings import Determinism
from dsv4_operator.api.rollout import (
    CanarySpec,
    EngineRevision,
    RolloutPhase,
    RolloutStatus,
    RolloutVerdict,
)
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.kube.cache import Reader
from dsv4_operator.render.meta import LABEL_INSTANCE, Owner
from dsv4_operator.render.router import ROUTER_PORT, router_name
from dsv4_operator.rollout import manual
from dsv4_operator.rollout.decide import Decision, Effect, Observed, ProbeOutcome
from dsv4_operator.rollout.digest import Builds
from dsv4_operator.rollout.executor import ProbeExecutor
from dsv4_operator.rollout.observe import slice_ready
from dsv4_operator.rollout.reports import (
    FiledReport,
    ReportRef,
    Trust,
    owned_outcome,
    report_selector,
    stale_canary_reports,
    untrusted,
)
from dsv4_operator.rollout.slices import (
    canary_owner,
    canary_spec,
    canary_url,
    spec_revision,
    with_revision,
)

log = logging.getLogger("dsv4_operator.rollout")

# (namespace, service, port) → base URL a probe reaches the Service at.
ServiceUrl = Callable[[str, str, int], str]
# (namespace, service, port) → whether the Service serves: a ready endpoint behind it.
Serving = Callable[[str, str, int], bool]
SERVICE_NAME_LABEL = "kubernetes.io/service-name"  # on a Service's EndpointSlices
# A probe pod files its report, then exits, and Kubernetes then marks its Job Complete: a
# PASS read in between waits this long for that before it counts as INCONCLUSIVE.
JOB_EXIT_GRACE_S = 60.0


class PassView(Protocol):
    """What the rollout reads of the reconciler's pass, read once at its start (the
    reconciler's `PassState` is one: the rollout names only what it uses, and imports
    nothing of the reconciler)."""

    @property
    def owner(self) -> Owner: ...

    @property
    def obj(self) -> dict[str, Any]:
        """The DSV4Deployment as read (its annotations carry the manual controls)."""
        ...

    @property
    def spec(self) -> DSV4DeploymentSpec: ...

    @property
    def canary_live(self) -> list[dict[str, Any]]:
        """The children of the canary slice."""
        ...

    @property
    def now(self) -> dt.datetime: ...


def cluster_service_url(namespace: str, service: str, port: int) -> str:
    return f"http://{service}.{namespace}.svc:{port}"


def canary_report(status: RolloutStatus) -> ReportRef | None:
    """The report of the current canary probe attempt; None before the first attempt."""
    if status.canary_revision is None or status.probe_attempt == 0:
        return None
    return ReportRef("canary", status.canary_revision, attempt=status.probe_attempt)


def watch_report(status: RolloutStatus) -> ReportRef | None:
    """The report of the latest production watch run; None before the first one."""
    if status.stable_probe is None:
        return None
    return ReportRef("stable", status.stable_revision, started=status.stable_probe.started_at)


@dataclass
class RolloutController:
    """Holds what outlives a pass: the probe executor and how probes reach a Service.

    Reads go to ``cache`` (the reconciler's), writes to ``kube``.  ``probe_url`` is where
    the probes reach a Service; ``serving`` whether it serves (by default the Kubernetes
    API's word, read only while a canary starts: the operator itself never calls an engine
    or a router, so a NetworkPolicy need not let it in)."""

    kube: Any
    cache: Reader
    executor: ProbeExecutor
    probe_url: ServiceUrl = cluster_service_url
    serving: Serving | None = None
    # (namespace, report) → when a pass first read its PASS while the Job still ran.
    _exit_seen: dict[tuple[str, str], dt.datetime] = field(default_factory=dict, init=False)

    # -- before the decision ------------------------------------------------------------
    def observe(
        self,
        state: PassView,
        before: RolloutStatus,
        canary_objects: list[dict[str, Any]],
        **known: Any,
    ) -> Observed:
        """What `decide` needs to know; ``known``: what the reconciler observed itself
        (rolled roles, a blocked canary).  Readiness decides anything only while the canary
        starts: its Service's endpoints are read only then."""
        owner = state.owner
        starting = before.phase is RolloutPhase.CANARY_STARTING
        probing = before.phase is RolloutPhase.PROBING
        canary = canary_report(before) if probing else None
        pending = before.stable_probe is not None and before.stable_probe.pending
        watch = watch_report(before) if pending else None
        return Observed(
            now=state.now,
            canary_ready=starting
            and slice_ready(canary_objects, state.canary_live)
            and (self.serving or self._endpoint_ready)(owner.namespace, *canary_url(owner)),
            probe=self._canary_outcome(state, before, canary) if canary else None,
            probe_running=canary is not None and self.executor.running(owner, canary.name(owner)),
            stable_probe=self._outcome(state, watch) if watch else None,
            stable_probe_running=watch is not None
            and self.executor.running(owner, watch.name(owner)),
            manual=manual.parse(state.obj["metadata"].get("annotations")),
            canary_builds=self._builds(owner) if canary else Builds(),
            **known,
        )

    def _builds(self, owner: Owner) -> Builds:
        """The builds the canary's engine pods report running (from the pod cache)."""
        selector = f"{LABEL_INSTANCE}={canary_owner(owner).name}"
        return Builds.of(self.cache.list("Pod", owner.namespace, selector))

    def _endpoint_ready(self, namespace: str, service: str, port: int) -> bool:
        """A canary is Ready only once its router Service has a ready endpoint (an
        EndpointSlice the API keeps from the router pods' readiness): the probes' first
        request must not be the one that finds out the endpoint is not there yet."""
        selector = f"{SERVICE_NAME_LABEL}={service}"
        slices = self.kube.list("EndpointSlice", namespace, selector)
        ready = any(
            (endpoint.get("conditions") or {}).get("ready")
            for found in slices
            if any(p.get("port") == port for p in found.get("ports") or [])
            for endpoint in found.get("endpoints") or []
        )
        if not ready:
            log.info("canary %s.%s has no ready endpoint yet", service, namespace)
        return ready

    def _outcome(self, state: PassView, ref: ReportRef) -> ProbeOutcome | None:
        """A watch run's verdict (a report someone else put there: FAIL)."""
        owner = state.owner
        config_map = self.cache.holder("ConfigMap", owner.namespace, ref.name(owner))
        return owned_outcome(config_map, owner) if config_map else None

    def _canary_outcome(
        self, state: PassView, before: RolloutStatus, ref: ReportRef
    ) -> ProbeOutcome | None:
        """The attempt's verdict as a rollout may act on it (`reports.Trust`: a report the
        operator did not create FAILs; a PASS holds up against the canary settings, the
        host-tier reads the canary's revision asks for, and its Job's exit).

        A probe pod files its report and only then exits, so the report's watch event can
        wake a pass while its Job is still active: such a PASS is no verdict yet (None, the
        probe still runs) until the Job completes, for at most `JOB_EXIT_GRACE_S`."""
        owner = state.owner
        name = ref.name(owner)
        config_map = self.cache.holder("ConfigMap", owner.namespace, name)
        if config_map is None:
            return None
        completed = self.executor.completed(owner, name)
        exiting = completed is False and self.executor.running(owner, name)
        hicache = before.canary is not None and probes_hicache(before.canary)
        trust = Trust(
            owner,
            state.spec.canary,
            lambda revision: hicache,
            lambda report: None if exiting else completed,
        )
        found = trust.outcome(config_map)
        if found is not None and found.verdict is RolloutVerdict.PASS and exiting:
            why = self._exit_overdue(state, name)  # holds up so far: the Job's exit decides
            if why is None:
                return None  # wait for the Job to complete
            found = untrusted(found, why)
        self._exit_seen.pop((owner.namespace, name), None)
        return found

    def _exit_overdue(self, state: PassView, report: str) -> str | None:
        """Why a PASS whose Job is still active is no longer waited for, or None while the
        grace runs.  The grace counts on this process's clock from the first pass that saw
        it (a restarted operator starts it again; `probeTimeoutSeconds` still bounds all)."""
        seen = self._exit_seen.setdefault((state.owner.namespace, report), state.now)
        if (state.now - seen).total_seconds() < JOB_EXIT_GRACE_S:
            log.info("report %s says PASS; waiting for its probe Job to complete", report)
            return None
        return (
            f"its probe Job was still running {JOB_EXIT_GRACE_S:.0f} s after the PASS was "
            "seen (a PASS counts once its Job completed with exit code 0)"
        )

    # -- after the status write ---------------------------------------------------------
    def carry_out(self, state: PassView, before: RolloutStatus | None, decision: Decision) -> None:
        owner, status = state.owner, decision.status
        for effect in decision.effects:
            if effect is Effect.START_PROBE:
                ref = canary_report(status)
                assert ref is not None
                service, port = canary_url(owner)
                url = self._probe_url(owner.namespace, service, port)
                assert status.canary is not None
                tested = canary_spec(state.spec, status.canary, state.spec.canary)  # what runs
                try:
                    baseline: str | None = self._stable_url(owner)
                except ValueError as err:
                    # No endpoint for it (yet): on an engine that is not deterministic the
                    # consistency samples then do not apply, and the report says why.
                    log.warning(
                        "canary of %s/%s probed without a baseline: %s",
                        owner.namespace,
                        owner.name,
                        err,
                    )
                    baseline = None
                self.executor.start(owner, ref, canary_settings(tested, url, baseline))
                self._prune_reports(state)
            elif effect is Effect.STOP_PROBE and before is not None:
                ref = canary_report(before)
                if ref is not None:
                    self.executor.stop(owner, ref.name(owner))
            elif effect is Effect.START_STABLE_PROBE:
                self._watch(state, before, status)

    def _watch(self, state: PassView, before: RolloutStatus | None, status: RolloutStatus) -> None:
        """A production watch run.  Only the latest report is kept: what the previous one
        found is already in status.rollout.stableProbe."""
        owner = state.owner
        previous = watch_report(before) if before is not None else None
        if previous is not None:
            self.kube.delete("ConfigMap", owner.namespace, previous.name(owner))
        ref = watch_report(status)
        assert ref is not None
        try:
            url = self._stable_url(owner)
        except ValueError as err:
            log.warning("watch of %s/%s skipped: %s", owner.namespace, owner.name, err)
            return
        rollout = state.spec.rollout
        serving = with_revision(state.spec, status.stable)
        settings = canary_settings(serving, url).model_copy(
            update={
                "concurrency": rollout.stable_probe_concurrency,
                "requests": rollout.stable_probe_requests,
            }
        )
        self.executor.start(owner, ref, settings)

    def _prune_reports(self, state: PassView) -> None:
        owner = state.owner
        listed = self.cache.list("ConfigMap", owner.namespace, report_selector(owner))
        for name in stale_canary_reports([FiledReport.of(cm) for cm in listed]):
            self.kube.delete("ConfigMap", owner.namespace, name)

    def _probe_url(self, namespace: str, service: str, port: int) -> str:
        return self.probe_url(namespace, service, port)

    def _stable_url(self, owner: Owner) -> str:
        """The stable slice's router: what users call, the production watch probes, and a
        canary's differential consistency compares with."""
        return self._probe_url(owner.namespace, router_name(owner), ROUTER_PORT)


def probes_hicache(revision: EngineRevision) -> bool:
    """Whether a probe of the engines ``spec`` renders must show host-tier reads: HiCache
    is on (for any role), so a PASS needs samples that read a prefix back from the host
    tier (`dsv4_engine.probe.verdict.unexercised`), in the probe's verdict and in the
    operator's re-check of it alike."""
    return revision.features.hicache.enabled


def canary_settings(
    spec: DSV4DeploymentSpec, url: str, baseline: str | None = None
) -> ProbeSettings:
    """What a probe attempt runs with: `spec.canary`, against ``url``, for the engines
    ``spec`` renders.  What the probe cannot ask sglang-router (it serves no /server_info)
    it is told: the served model, the reference model, and whether the engine is
    deterministic (SGLang refuses deterministic inference for DeepSeek-V4, sglang#36174; a
    reference engine is, unless it is told to flip near-ties).  Engines that run kv-canary
    (a canary always does: `slices.canary_spec`) have their violations read; with HiCache,
    the engines' host-tier reads (`dsv4_engine.probe.evidence`), which the canary's capped
    device pool makes happen by eviction.  ``baseline``: the stable router, for a canary;
    on an engine that is not deterministic its consistency probes then compare the
    canary's divergence with the stable's."""
    canary: CanarySpec = spec.canary
    hicache = probes_hicache(spec_revision(spec))
    reference = spec.engine is Backend.REFERENCE
    deterministic = reference and not spec.features.fault_injection.benign_nondeterminism
    return ProbeSettings(
        hicache=hicache,
        base_url=url,
        baseline_url=baseline,
        backend=spec.engine,
        model=spec.model.served_model_name,
        reference_model=spec.model.reference_model if reference else None,
        deterministic=Determinism.YES if deterministic else Determinism.NO,
        probes=canary.probes or (),
        concurrency=canary.concurrency,
        requests=canary.sample_count,
        max_corruption_rate=canary.max_corruption_rate,
        confidence=canary.confidence,
        max_duration_s=float(canary.probe_timeout_seconds),
        kv_canary=spec.features.kv_canary is not KvCanary.OFF,
    )
