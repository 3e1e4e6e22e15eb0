"""A probe attempt as a Job: the command it runs parses back to the very probe settings the
rollout chose, it files into the attempt's report, and a verdict is never re-run."""

from __future__ import annotations

import pytest

from dsv4_engine.cliutil import build_parser
from dsv4_engine.probe import ProbeName, ProbeSettings
from dsv4_engine.probe.args import BY_HAND, NOT_OPTIONS, OPTIONS, probe_args, settings_from
from dsv4_engine.probe.exitcodes import VERDICT_NOT_FILED
from dsv4_engine.probe.verdict import Verdict
from dsv4_operator import cli
from dsv4_operator.kube.selectors import label_match
from dsv4_operator.render.meta import LABEL_MANAGED_BY, MANAGED_BY, Owner, instance_selector
from dsv4_operator.rollout.probe_job import (
    CONTAINER,
    PROBE_CLUSTER_ROLE,
    JobState,
    job_state,
    owned_by,
    probe_account,
    probe_identity,
    probe_job,
)
from dsv4_operator.rollout.reports import (
    MAX_JOB_NAME,
    FiledReport,
    job_name,
    stale_canary_reports,
)

OWNER = Owner(name="flash", namespace="prod", uid="uid-of-flash")
REPORT = {"metadata": {"name": "flash-canary-ab12cd34-1", "uid": "uid-of-report"}}
# Every option `dsv4ctl probe` has, away from its default.
EVERYTHING = ProbeSettings(
    base_url="http://flash-canary-router.prod.svc:8000",
    backend="reference",
    model="deepseek-v4-flash",
    probes=(ProbeName.CACHE_CONSISTENCY, ProbeName.TOOLCALL_ECHO_LONG_CONTEXT),
    format="v41",
    concurrency=17,
    requests=321,
    max_corruption_rate=0.012,
    confidence=0.99,
    warm_up_s=45.0,
    max_tokens=99,
    request_timeout_s=33.5,
    max_duration_s=600.0,
    prefix_words=200,
    sessions_per_prefix=3,
    long_context_words=4000,
    seed=7,
    deterministic="yes",
    admin_offload_path=None,
    hicache=True,
)


def parse(argv: list[str]):
    return build_parser("dsv4ctl", "", cli, argv).parse_args(argv)


@pytest.mark.parametrize(
    "settings",
    [EVERYTHING, ProbeSettings(base_url="http://x:1")],
    ids=["every-option", "defaults"],
)
def test_probe_args_parse_back_to_the_same_settings(settings):
    args = parse(["probe", *probe_args(settings)])
    assert settings_from(args) == settings


def test_dsv4ctl_probes_defaults_are_the_settings_defaults():
    assert settings_from(parse(["probe", "http://x:1"])) == ProbeSettings(base_url="http://x:1")


def test_every_probe_setting_is_an_option_or_refused_by_name():
    covered = {*BY_HAND, *(option.field for option in OPTIONS)}
    assert covered | set(NOT_OPTIONS) == set(ProbeSettings.model_fields)
    with pytest.raises(ValueError, match="api_key"):
        probe_args(ProbeSettings(base_url="http://x:1", api_key="secret"))


def test_the_job_runs_dsv4ctl_probe_with_the_rollouts_settings_and_files_its_report():
    job = probe_job(OWNER, REPORT, "canary", EVERYTHING, "ghcr.io/dsv4/operator:0.2.0")
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "ghcr.io/dsv4/operator:0.2.0"
    assert container["command"] == ["dsv4ctl"]
    args = parse(container["args"])
    assert args.command == "probe"
    assert settings_from(args) == EVERYTHING
    assert (args.report_configmap, args.report_namespace) == ("flash-canary-ab12cd34-1", "prod")
    assert pod["serviceAccountName"] == probe_account(OWNER)
    # The report owns the Job: deleting an old report takes its Job along.
    (ref,) = job["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["uid"]) == (
        "ConfigMap",
        REPORT["metadata"]["name"],
        "uid-of-report",
    )
    # Written by the operator (the admission fence's label), pruned by nobody but its
    # owner: the children reconcile's selector leaves a rollout's objects out.
    assert job["metadata"]["labels"][LABEL_MANAGED_BY] == MANAGED_BY
    assert not label_match(instance_selector(OWNER))(job["metadata"]["labels"])
    # Kubernetes stops a probe that outlives its step (the operator decided long before).
    assert job["spec"]["activeDeadlineSeconds"] > EVERYTHING.max_duration_s


def test_a_verdict_ends_the_job_and_only_a_crash_is_retried():
    spec = probe_job(OWNER, REPORT, "canary", EVERYTHING, "img")["spec"]
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    fail_job, ignore = spec["podFailurePolicy"]["rules"]
    assert fail_job["action"] == "FailJob"
    assert fail_job["onExitCodes"]["containerName"] == CONTAINER
    assert fail_job["onExitCodes"]["values"] == [
        Verdict.FAIL.exit_code,
        Verdict.INCONCLUSIVE.exit_code,
        VERDICT_NOT_FILED,
    ]  # re-running a probe until it passes is what a canary must never do
    assert ignore == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}
    # Exit 3 (could not run: no verdict reached) is retried; a retried pod first reads the
    # report and exits with a verdict filed there (tests/unit/probe/test_probe_cli.py).
    assert spec["backoffLimit"] >= 1


def test_the_probe_identity_binds_the_shipped_probe_cluster_role_and_writes_no_rules():
    sa, binding = probe_identity(OWNER)
    assert [o["kind"] for o in (sa, binding)] == ["ServiceAccount", "RoleBinding"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": PROBE_CLUSTER_ROLE,
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": probe_account(OWNER), "namespace": OWNER.namespace}
    ]
    assert sa["metadata"]["name"] == binding["metadata"]["name"] == probe_account(OWNER)
    # Both are the deployment's, the same for every attempt, and no child of the pass.
    children = label_match(instance_selector(OWNER))
    for obj in (sa, binding):
        (owner,) = obj["metadata"]["ownerReferences"]
        assert owner["uid"] == OWNER.uid
        assert obj["metadata"]["labels"][LABEL_MANAGED_BY] == MANAGED_BY
        assert not children(obj["metadata"]["labels"])


def test_job_names_fit_a_label_and_stay_distinct():
    assert job_name("flash-canary-ab12cd34-1") == "flash-canary-ab12cd34-1"
    base = "a-very-long-deployment-name-for-the-team-x-stable-0123456789-0-20261129t141500z"
    one, two = job_name(base), job_name(base.replace("141500", "151500"))
    assert len(one) <= MAX_JOB_NAME and len(two) <= MAX_JOB_NAME
    assert one != two and one == job_name(base)
    assert one[0].isalnum() and one[-1].isalnum()


def test_a_job_is_the_attempts_only_when_the_operator_made_it_for_that_very_report():
    job = probe_job(OWNER, REPORT, "canary", EVERYTHING, "operator:1")
    assert owned_by(job, REPORT)
    remade = {"metadata": {**REPORT["metadata"], "uid": "uid-of-a-report-made-again"}}
    assert not owned_by(job, remade)
    unlabelled = {**job, "metadata": {**job["metadata"], "labels": {}}}
    assert not owned_by(unlabelled, REPORT)


def condition(kind: str, status: str = "True", reason: str = "", message: str = "") -> dict:
    return {"type": kind, "status": status, "reason": reason, "message": message}


@pytest.mark.parametrize(
    ("conditions", "state"),
    [
        ([], JobState.ACTIVE),
        ([condition("FailureTarget", reason="PodFailurePolicy")], JobState.ACTIVE),
        ([condition("Complete", status="False")], JobState.ACTIVE),
        ([condition("SuccessCriteriaMet"), condition("Complete")], JobState.SUCCEEDED),
        (
            [condition("FailureTarget"), condition("Failed", reason="BackoffLimitExceeded")],
            JobState.FAILED,
        ),
    ],
)
def test_job_state_follows_the_terminal_conditions(conditions, state):
    assert job_state({"status": {"conditions": conditions}})[0] is state


def test_job_state_says_why_a_job_failed():
    job = {
        "status": {
            "conditions": [
                condition(
                    "Failed",
                    reason="DeadlineExceeded",
                    message="Job was active longer than specified deadline",
                )
            ]
        }
    }
    assert job_state(job) == (
        JobState.FAILED,
        "DeadlineExceeded: Job was active longer than specified deadline",
    )
    assert job_state(None) == (JobState.ABSENT, "absent")


def test_only_the_newest_canary_reports_are_kept():
    def report(rev: str, created: str, target: str = "canary") -> FiledReport:
        return FiledReport(f"flash-{target}-{rev}", target, rev, 1, created, None)

    reports = [report(f"rev{i}", f"2026-11-29T12:{i:02d}:00Z") for i in range(12)] + [
        report("rev9", "2026-11-29T11:00:00Z", target="stable")
    ]
    stale = stale_canary_reports(reports, keep=10)
    assert stale == ["flash-canary-rev0", "flash-canary-rev1"]  # oldest first
    assert stale_canary_reports(reports[:10], keep=10) == []
