"""Probe attempts as Kubernetes Jobs (the real-cluster executor; see `probe_job`).

Everything it knows lives in the API: whether an attempt runs is whether its Job is
active, and its verdict is its report ConfigMap.  A restarted operator therefore finds a
running Job and waits for it instead of starting a second probe.  It reads Jobs and reports
from the cache, but for the one decision a stale read could make wrong: whether a Job that
ended filed its report (read from the API server before recording INCONCLUSIVE over it).
"""

from __future__ import annotations

import logging
from typing import Any

from dsv4_engine.probe import ProbeSettings
from dsv4_operator.kube.cache import Reader
from dsv4_operator.kube.client import ApiError
from dsv4_operator.render.meta import Owner
from dsv4_operator.rollout.executor import create_report, record
from dsv4_operator.rollout.probe_job import (
    JobState,
    job_state,
    owned_by,
    probe_identity,
    probe_job,
)
from dsv4_operator.rollout.reports import (
    LABEL_TARGET,
    Evidence,
    ReportRef,
    job_name,
    outcome_from_config_map,
    report_config_map,
    requests_from_config_map,
)

log = logging.getLogger("dsv4_operator.rollout")


class JobProbeExecutor:
    def __init__(self, kube: Any, cache: Reader, image: str) -> None:
        self.kube = kube
        self.cache = cache
        self.image = image
        # (namespace, report) of the Jobs this process saw running: their verdicts go into
        # the metrics once filed.  A Job that ended before this process started was
        # counted by the one that watched it.
        self._watching: set[tuple[str, str]] = set()

    def running(self, owner: Owner, report: str) -> bool:
        job = self.cache.get("Job", owner.namespace, job_name(report))
        state, _ = job_state(job)
        if state is JobState.ACTIVE:
            self._watching.add((owner.namespace, report))
        if job is not None:
            # Once filed, even while the Job still runs: the pod files, then exits, and
            # the pass that reads a FAIL rolls back and never asks about this Job again.
            self._record(owner, report, job)
        return state is JobState.ACTIVE

    def completed(self, owner: Owner, report: str) -> bool | None:
        """Whether the attempt's own Job — the operator's, owned by the report it created —
        completed.  A Job that is gone (its TTL passed) can no longer vouch for its report:
        False."""
        job = self.cache.get("Job", owner.namespace, job_name(report))
        config_map = self.cache.get("ConfigMap", owner.namespace, report)
        if config_map is None or job is None or not owned_by(job, config_map):
            return False
        return job_state(job)[0] is JobState.SUCCEEDED

    def start(self, owner: Owner, ref: ReportRef, settings: ProbeSettings) -> None:
        report = ref.name(owner)
        job = self.cache.get("Job", owner.namespace, job_name(report))
        state, why = job_state(job)
        if state is JobState.ACTIVE:
            return
        if state is not JobState.ABSENT:
            self._ended_without_report(owner, ref, settings, why)
            return
        skeleton = create_report(self.kube, owner, ref)
        if skeleton is None:
            return  # someone else's: the pass reads it as FAIL (`reports.owned_outcome`)
        for obj in probe_identity(owner):
            self.kube.apply(obj)
        made = probe_job(owner, skeleton, ref.target, settings, self.image)
        try:
            self.kube.create(made)
        except ApiError as err:
            if err.status != 409:
                raise
            held = self.kube.get("Job", owner.namespace, made["metadata"]["name"])
            if held is None or not owned_by(held, skeleton):
                self._foreign_job(owner, ref, settings, made["metadata"]["name"])
                return
        self._watching.add((owner.namespace, report))
        log.info("probe %s: Job %s created", report, job_name(report))

    def stop(self, owner: Owner, report: str) -> None:
        name = job_name(report)
        if job_state(self.cache.get("Job", owner.namespace, name))[0] is JobState.ACTIVE:
            # Background propagation: the API's default for a Job orphans its running pod.
            self.kube.delete("Job", owner.namespace, name, propagation="Background")
            log.info("probe %s: Job %s stopped", report, name)

    def _ended_without_report(
        self, owner: Owner, ref: ReportRef, settings: ProbeSettings, why: str
    ) -> None:
        """The Job is over and left no verdict (its pods crashed, it hit its deadline, or it
        was never really run): that attempt gave no evidence, which is INCONCLUSIVE.  It is
        not run again: the rollout decides what happens next, as for any verdict."""
        report = ref.name(owner)
        config_map = self.kube.get("ConfigMap", owner.namespace, report)
        if config_map is not None and outcome_from_config_map(config_map) is not None:
            return  # filed after all (read just now): the next pass reads it
        message = f"probe Job {job_name(report)} ended without filing its report ({why})"
        evidence = Evidence.inconclusive(report, settings.base_url, message)
        self.kube.apply(report_config_map(owner, ref, evidence))
        self._watching.discard((owner.namespace, report))
        record(owner, ref.target, evidence)
        log.warning("probe %s: %s", report, message)

    def _foreign_job(self, owner: Owner, ref: ReportRef, settings: ProbeSettings, job: str) -> None:
        """A Job the operator did not create holds the attempt's Job name: whatever it
        files is no evidence of this attempt, which FAILs (never runs in its stead)."""
        report = ref.name(owner)
        message = (
            f"a Job named {job} that the operator did not create for this attempt holds its "
            "probe Job's name: the attempt cannot run its own probe, and FAILs"
        )
        evidence = Evidence.failed(report, settings.base_url, message)
        self.kube.apply(report_config_map(owner, ref, evidence))
        record(owner, ref.target, evidence)
        log.warning("probe %s: %s", report, message)

    def _record(self, owner: Owner, report: str, job: dict[str, Any]) -> None:
        """Metrics for the verdict a watched Job filed, once (none filed yet: later)."""
        key = (owner.namespace, report)
        if key not in self._watching:
            return
        config_map = self.cache.get("ConfigMap", owner.namespace, report)
        outcome = outcome_from_config_map(config_map) if config_map else None
        if outcome is None or config_map is None:
            return  # none filed: `start` records the INCONCLUSIVE it files instead
        self._watching.discard(key)
        target = job["metadata"].get("labels", {}).get(LABEL_TARGET, "canary")
        record(owner, target, Evidence({}, outcome, requests_from_config_map(config_map)))
