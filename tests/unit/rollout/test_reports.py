"""Report ConfigMaps: what the operator creates, what a probe fills in, what is read back."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from dsv4_engine.probe import ProbeName, ProbeSettings, run_probes
from dsv4_engine.probe.scripted_server import ScriptedCompletionServer
from dsv4_operator.api.rollout import CanarySpec, RolloutVerdict
from dsv4_operator.kube.selectors import label_match
from dsv4_operator.render.meta import LABEL_MANAGED_BY, MANAGED_BY, Owner, instance_selector
from dsv4_operator.rollout.decide import ProbeOutcome
from dsv4_operator.rollout.reports import (
    MAX_JOB_NAME,
    REPORT_KEY,
    Evidence,
    FiledReport,
    ReportRef,
    Trust,
    distrust_pass,
    foreign_report,
    job_name,
    outcome_from_config_map,
    owned_outcome,
    report_config_map,
    report_filing,
    report_skeleton,
    requests_from_config_map,
)

OWNER = Owner(name="flash", namespace="prod", uid="uid-of-flash")
REF = ReportRef("canary", "ab12cd34", attempt=3)
NAME = "flash-canary-ab12cd34-3"
FAILED = Evidence(
    body={"verdict": "FAIL", "samples": {"judged": 26}},
    outcome=ProbeOutcome(RolloutVerdict.FAIL, 0.15, 0.31, 26, NAME, "4/26 corrupt"),
    requests={"valid": 22, "corrupt_dsml": 4},
)


def test_a_filed_report_reads_back_as_the_same_verdict_and_requests():
    config_map = report_config_map(OWNER, REF, FAILED)
    assert outcome_from_config_map(config_map) == FAILED.outcome
    assert requests_from_config_map(config_map) == FAILED.requests
    assert json.loads(config_map["data"][REPORT_KEY]) == FAILED.body
    assert config_map["metadata"]["annotations"]["inference.dsv4.dev/verdict"] == "FAIL"


def test_the_whole_report_is_the_skeleton_plus_what_a_probe_files():
    skeleton = report_skeleton(OWNER, REF)
    filing = report_filing(FAILED)
    whole = report_config_map(OWNER, REF, FAILED)
    assert whole["data"] == filing["data"]
    assert whole["metadata"]["name"] == NAME == REF.name(OWNER)
    annotations = whole["metadata"]["annotations"]
    assert annotations == {
        **skeleton["metadata"]["annotations"],
        **filing["metadata"]["annotations"],
    }
    # Not a child the reconcile would prune; garbage-collected with the DSV4Deployment.
    assert whole["metadata"]["labels"][LABEL_MANAGED_BY] == MANAGED_BY
    assert not label_match(instance_selector(OWNER))(whole["metadata"]["labels"])
    assert whole["metadata"]["ownerReferences"][0]["uid"] == OWNER.uid


def test_a_report_without_a_verdict_yet_is_no_evidence():
    assert outcome_from_config_map(report_skeleton(OWNER, REF)) is None
    assert requests_from_config_map(report_skeleton(OWNER, REF)) == {}
    garbled = {"metadata": {"name": NAME}, "data": {"outcome.json": "{not json"}}
    assert outcome_from_config_map(garbled) is None


def test_an_attempt_without_a_probe_result_is_inconclusive_and_says_why():
    evidence = Evidence.inconclusive(NAME, "http://canary:8000", "probe Job ended (Complete)")
    outcome = outcome_from_config_map(report_config_map(OWNER, REF, evidence))
    assert outcome is not None and outcome.verdict is RolloutVerdict.INCONCLUSIVE
    assert (outcome.rate, outcome.bound, outcome.samples) == (None, None, 0)
    assert outcome.message == "probe Job ended (Complete)"
    assert evidence.requests == {}  # no request was sent, none is counted


def test_a_report_says_which_run_it_is_so_a_lost_status_can_be_rebuilt():
    filed = FiledReport.of(report_config_map(OWNER, REF, FAILED))
    assert (filed.name, filed.target, filed.revision, filed.attempt) == (
        NAME,
        "canary",
        "ab12cd34",
        3,
    )
    assert filed.outcome == FAILED.outcome
    watch = ReportRef("stable", "ab12cd34", started="2026-11-29T12:00:00Z")
    assert watch.name(OWNER) == "flash-stable-ab12cd34-20261129t120000z"


PASSED = ProbeOutcome(
    RolloutVerdict.PASS, 0.0, 0.00499, 598, NAME, exercised=0, kv_canary_violations=0
)


def test_a_pass_is_trusted_only_when_the_report_holds_up():
    """A PASS promotes production, so the operator re-checks the report it reads.  Who
    filed it is not among the checks: a field manager is a name the client picks (the
    forged PASS of issue 62 was filed under the probe's); admission checks the writer."""

    def why(outcome, completed: bool | None = True) -> str | None:
        return distrust_pass(outcome, 598, 0.005, 0.95, completed, hicache=False)

    assert why(PASSED) is None
    assert why(PASSED, completed=None) is None
    short = ProbeOutcome(RolloutVerdict.PASS, 0.0, 0.004, 400, NAME)
    assert "400 judged samples, 598 required" in why(short)
    dirty = ProbeOutcome(RolloutVerdict.PASS, 1 / 598, 0.004, 598, NAME)
    assert "1/598 corrupt bounds the rate" in why(dirty)
    assert "did not complete with exit code 0" in why(PASSED, completed=False)


def test_only_the_report_the_operator_created_is_its_own():
    """Any verdict in a ConfigMap at a report's name that the operator did not create (its
    labels, the Job it names, the DSV4Deployment as controller) is evidence that existed
    before the run: the attempt FAILs on it, whatever it says."""
    passed = Evidence(body={"verdict": "PASS"}, outcome=PASSED, requests={"valid": 598})
    own = report_config_map(OWNER, REF, passed)
    assert foreign_report(own, OWNER) is None
    assert own["metadata"]["annotations"]["inference.dsv4.dev/probe-job"] == NAME
    unlabelled = {**own, "metadata": {"name": NAME, "namespace": "prod"}}
    assert "app.kubernetes.io/component" in foreign_report(unlabelled, OWNER)
    other_job = json.loads(json.dumps(own))
    other_job["metadata"]["annotations"]["inference.dsv4.dev/probe-job"] = "tenant-job"
    assert "inference.dsv4.dev/probe-job" in foreign_report(other_job, OWNER)
    other_owner = json.loads(json.dumps(own))
    other_owner["metadata"]["ownerReferences"][0]["uid"] = "uid-of-a-namesake"
    assert "not controlled by DSV4Deployment flash" in foreign_report(other_owner, OWNER)
    for forged in (unlabelled, other_job, other_owner):
        outcome = owned_outcome(forged, OWNER)
        assert outcome is not None and outcome.verdict is RolloutVerdict.FAIL
        assert outcome.message.startswith("evidence existed before the run: ConfigMap " + NAME)
        trusted = Trust(OWNER, CanarySpec(), lambda r: False, lambda r: True).outcome(forged)
        assert trusted.verdict is RolloutVerdict.FAIL
    assert owned_outcome(report_skeleton(OWNER, REF), OWNER) is None  # none filed yet
    assert owned_outcome(unlabelled | {"data": {}}, OWNER).verdict is RolloutVerdict.FAIL


def test_long_report_names_get_jobs_whose_names_fit():
    long_owner = Owner(name="x" * 40, namespace="prod", uid="u")
    ref = ReportRef("stable", "ab12cd34", started="2026-11-29T12:00:00Z")
    job = ref.job(long_owner)
    assert len(ref.name(long_owner)) > MAX_JOB_NAME >= len(job)
    assert (
        report_skeleton(long_owner, ref)["metadata"]["annotations"]["inference.dsv4.dev/probe-job"]
        == job
        == job_name(ref.name(long_owner))
    )


def test_a_hicache_pass_is_trusted_only_with_enough_host_tier_reads():
    """The probe's rule (`verdict.unexercised`), applied again to the report: with HiCache
    on, a PASS whose samples did not read 24 prefixes back from the host tier (or whose
    report does not say, as one filed before they were counted) promotes nothing; without
    HiCache the count is not asked for."""

    def why(outcome: ProbeOutcome, hicache: bool) -> str | None:
        return distrust_pass(outcome, 598, 0.005, 0.95, True, hicache=hicache)

    assert why(PASSED, hicache=False) is None
    assert why(PASSED, hicache=True) == (
        "HiCache is on but only 0 judged answers are proven to have read a "
        "prefix back from the host tier; at least 24 required"
    )
    unsaid = ProbeOutcome(RolloutVerdict.PASS, 0.0, 0.00499, 598, NAME)
    assert "only 0 judged answers" in why(unsaid, hicache=True)
    assert "only 23 judged answers" in why(replace(PASSED, exercised=23), hicache=True)
    assert why(replace(PASSED, exercised=24), hicache=True) is None


def test_a_pass_is_trusted_only_when_the_canary_engines_kv_canary_was_read_clean():
    """Every canary runs kv-canary (`slices.canary_spec`): a PASS whose report does not show
    it read (one filed before the probe read it, or a read that failed), or shows a
    violation, promotes nothing."""

    def why(violations: int | None) -> str | None:
        outcome = replace(PASSED, kv_canary_violations=violations)
        return distrust_pass(outcome, 598, 0.005, 0.95, True, hicache=False)

    assert why(0) is None
    assert why(None) == "it does not show the canary engines' kv-canary violations read"
    assert why(2) == "its engines counted 2 kv-canary violations"
    counted = replace(FAILED, outcome=replace(FAILED.outcome, kv_canary_violations=3))
    assert outcome_from_config_map(report_config_map(OWNER, REF, counted)).kv_canary_violations == 3


def test_the_exercised_count_reads_back_from_a_filed_report():
    counted = replace(FAILED, outcome=replace(FAILED.outcome, exercised=17))
    assert outcome_from_config_map(report_config_map(OWNER, REF, counted)).exercised == 17


def test_a_report_read_for_recovery_is_re_checked_against_its_revisions_hicache():
    """The recovery path reads reports through `FiledReport.of` with the canary settings:
    a PASS without host-tier reads proves nothing of a revision that runs HiCache (or of
    one no workload records), and stays a PASS for one that runs without it."""
    passed = Evidence(body={"verdict": "PASS"}, outcome=PASSED, requests={"valid": 598})
    filed = report_config_map(OWNER, REF, passed)
    asked: list[str] = []

    def runs_hicache(revision: str) -> bool:
        asked.append(revision)
        return True

    def trust(hicache=lambda revision: True, completed=lambda report: True) -> Trust:
        return Trust(OWNER, CanarySpec(), hicache, completed)

    rechecked = FiledReport.of(filed, trust(runs_hicache))
    assert asked == [REF.revision]
    assert rechecked.outcome is not None
    assert rechecked.outcome.verdict is RolloutVerdict.INCONCLUSIVE
    assert (
        "only 0 judged answers are proven to have read a prefix back" in rechecked.outcome.message
    )
    assert FiledReport.of(filed, trust()).outcome.verdict is RolloutVerdict.INCONCLUSIVE
    without = FiledReport.of(filed, trust(lambda revision: False))
    assert without.outcome is not None and without.outcome.verdict is RolloutVerdict.PASS
    # ... and its Job must have completed, as on the rollout's own path.
    gone = FiledReport.of(filed, trust(lambda revision: False, lambda report: False))
    assert gone.outcome.verdict is RolloutVerdict.INCONCLUSIVE
    assert FiledReport.of(filed).outcome.verdict is RolloutVerdict.PASS, "as filed, unchecked"


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("server", "read", "filed"),
    [({}, True, 0), ({"kv_canary_violation_at": 10}, True, 1), ({}, False, None)],
    ids=["clean", "violation", "not-read"],
)
async def test_a_probe_files_the_kv_canary_violations_it_read(server, read, filed):
    """What the re-check reads is what the probe counted: 0 or more, None when not read."""
    scripted = ScriptedCompletionServer(**server)
    url = await scripted.start()
    try:
        settings = ProbeSettings(
            base_url=url, probes=(ProbeName.TOOLCALL_ECHO,), requests=50, kv_canary=read
        )
        result = await run_probes(settings)
    finally:
        await scripted.stop()
    config_map = report_config_map(OWNER, REF, Evidence.of(NAME, result))
    assert outcome_from_config_map(config_map).kv_canary_violations == filed
