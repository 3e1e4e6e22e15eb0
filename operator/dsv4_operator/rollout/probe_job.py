"""A probe attempt as a Kubernetes Job: `dsv4ctl probe` in the operator image, filing its
verdict into the attempt's report ConfigMap.  Pure functions; `job_executor` does the I/O.

The Job never decides anything: the report ConfigMap stays the only evidence, exactly as
when the operator probes in-process.  What the Job adds is Kubernetes' own bookkeeping —
a pod per attempt, logs, a deadline — and a verdict that does not die with the operator.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from dsv4_engine.probe import ProbeSettings
from dsv4_engine.probe.args import probe_args
from dsv4_engine.probe.exitcodes import VERDICT_NOT_FILED
from dsv4_engine.probe.verdict import Verdict
from dsv4_operator.render.meta import (
    LABEL_COMPONENT,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    PROBE_COMPONENT,
    Owner,
    metadata,
)
from dsv4_operator.render.rbac import cluster_role_identity
from dsv4_operator.render.security import Scratch, container_security, pod_security
from dsv4_operator.rollout.reports import LABEL_TARGET, job_name

COMPONENT = PROBE_COMPONENT
CONTAINER = "probe"
ANNOTATION_REPORT = "inference.dsv4.dev/report"
# Past its step's own deadline (decided by the operator) a probe is only load: Kubernetes
# stops it this long after the probe's last sample could have started.
DEADLINE_SLACK_S = 60
# A probe pod that could not run (exit 3: the API or the engine could not be reached before
# a verdict) is retried this often; a verdict (exit 1 FAIL, 2 INCONCLUSIVE, 4 reached but
# not filed) never is — re-running a probe until it passes is exactly what a canary must
# not do.  A retried pod (and one evicted) first reads the report: a verdict already there
# is evidence that existed before its run, never repeated: it exits FAIL (`cli.probe`).
RETRIES = 2
# Finished Jobs stay a day for `kubectl logs`; the report ConfigMap (their owner) stays as
# long as the rollout references it and takes its Job with it when deleted.
TTL_S = 86400
# The probe's writable /tmp (the operator image's HOME) under its read-only root: it keeps
# nothing but what Python and its HTTP client may spill.
PROBE_SCRATCH = Scratch(size="64Mi", limit="256Mi", paths=("/tmp",))
# Shipped by the install (manifests/base/rbac.yaml), bound to each deployment's probe
# account in its namespace: a probe reads its attempt's report and files its verdict into
# it (`dsv4ctl probe --report-configmap`: a get, then a server-side apply of the verdict).
# Which reports, and which of their fields, the fence decides (fence.yaml,
# dsv4-probe-fence): only an unfiled report of its own deployment, only its data and verdict
# annotations; it creates and deletes none.
PROBE_CLUSTER_ROLE = "dsv4-probe"
PROBE_RULES = [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "patch"]}]


class JobState(Enum):
    ABSENT = "absent"
    ACTIVE = "active"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


def probe_account(owner: Owner) -> str:
    return f"{owner.name}-probe"


def probe_identity(owner: Owner) -> list[dict[str, Any]]:
    """The deployment's probe account, bound in its namespace to the shipped
    `PROBE_CLUSTER_ROLE` (the operator writes no rules of its own), both named
    `probe_account` and going with the deployment."""
    account = probe_account(owner)
    return cluster_role_identity(owner, account, account, COMPONENT, PROBE_CLUSTER_ROLE)


def _owned_by(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": report["metadata"]["name"],
            "uid": report["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": False,
        }
    ]


def owned_by(job: dict[str, Any], report: dict[str, Any]) -> bool:
    """Whether ``job`` is the operator's probe Job of ``report`` (the report ConfigMap as
    created): labelled as the operator labels it and controlled by that very object (its
    uid: a report deleted and made again by anyone is another object)."""
    meta = job["metadata"]
    labels = meta.get("labels") or {}
    controllers = [r.get("uid") for r in meta.get("ownerReferences") or [] if r.get("controller")]
    return (
        labels.get(LABEL_MANAGED_BY) == MANAGED_BY
        and labels.get(LABEL_COMPONENT) == COMPONENT
        and controllers == [report["metadata"]["uid"]]
    )


def probe_job(
    owner: Owner, report: dict[str, Any], target: str, settings: ProbeSettings, image: str
) -> dict[str, Any]:
    """The Job for one attempt; ``report`` is the applied report ConfigMap (its owner)."""
    name = report["metadata"]["name"]
    meta = metadata(owner, job_name(name), COMPONENT)
    meta["labels"][LABEL_TARGET] = target
    meta["annotations"] = {ANNOTATION_REPORT: name}
    meta["ownerReferences"] = _owned_by(report)
    args = [
        "probe",
        *probe_args(settings),
        "--report-configmap", name,
        "--report-namespace", owner.namespace,
    ]  # fmt: skip
    storage_request, storage_limit = PROBE_SCRATCH.storage()
    container = {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["dsv4ctl"],
        "args": args,
        "resources": {
            "requests": {"cpu": "500m", "memory": "256Mi", **storage_request},
            "limits": {"cpu": "2", "memory": "1Gi", **storage_limit},
        },
        "securityContext": container_security(),
        "volumeMounts": PROBE_SCRATCH.mounts(),
    }
    spec: dict[str, Any] = {
        "backoffLimit": RETRIES,
        "ttlSecondsAfterFinished": TTL_S,
        "podFailurePolicy": {
            "rules": [
                {
                    "action": "FailJob",
                    "onExitCodes": {
                        "containerName": CONTAINER,
                        "operator": "In",
                        "values": [
                            Verdict.FAIL.exit_code,
                            Verdict.INCONCLUSIVE.exit_code,
                            VERDICT_NOT_FILED,
                        ],
                    },
                },
                # An evicted or preempted pod is no evidence either way: run it again.
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
            ]
        },
        "template": {
            "metadata": {"labels": dict(meta["labels"])},
            "spec": {
                "restartPolicy": "Never",
                "serviceAccountName": probe_account(owner),
                "securityContext": pod_security(),
                "containers": [container],
                "volumes": [PROBE_SCRATCH.volume()],
            },
        },
    }
    if settings.max_duration_s is not None:
        deadline = settings.max_duration_s + settings.request_timeout_s + DEADLINE_SLACK_S
        spec["activeDeadlineSeconds"] = int(deadline)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec}


def attempt_objects(
    owner: Owner, report: dict[str, Any], target: str, settings: ProbeSettings, image: str
) -> list[dict[str, Any]]:
    """What one attempt adds next to its report ``report`` (applied first: the Job is owned
    by it): the probe identity (the same for every attempt), then the Job."""
    return [*probe_identity(owner), probe_job(owner, report, target, settings, image)]


def job_state(job: dict[str, Any] | None) -> tuple[JobState, str]:
    """Where a probe Job is, and in words why it ended (its terminal condition)."""
    if job is None:
        return JobState.ABSENT, "absent"
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("status") != "True":
            continue
        why = f"{condition.get('reason') or condition['type']}: {condition.get('message', '')}"
        if condition.get("type") == "Complete":
            return JobState.SUCCEEDED, why.rstrip(": ")
        if condition.get("type") == "Failed":
            return JobState.FAILED, why.rstrip(": ")
    return JobState.ACTIVE, "running"
