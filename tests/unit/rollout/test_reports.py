"""Report ConfigMaps: what the operator creates, what a probe fills in, what is read back."""

from __future__ import annotations

import json

from dsv4_operator.api.rollout import RolloutVerdict
from dsv4_operator.render.meta import LABEL_MANAGED_BY, Owner
from dsv4_operator.rollout.decide import ProbeOutcome
from dsv4_operator.rollout.reports import (
    REPORT_KEY,
    Evidence,
    outcome_from_config_map,
    report_config_map,
    report_filing,
    report_skeleton,
    requests_from_config_map,
)

OWNER = Owner(name="flash", namespace="prod", uid="uid-of-flash")
NAME = "flash-canary-ab12cd34-3"
FAILED = Evidence(
    body={"verdict": "FAIL", "samples": {"judged": 26}},
    outcome=ProbeOutcome(RolloutVerdict.FAIL, 0.15, 0.31, 26, NAME, "4/26 corrupt"),
    requests={"valid": 22, "corrupt_dsml": 4},
)


def test_a_filed_report_reads_back_as_the_same_verdict_and_requests():
    config_map = report_config_map(OWNER, NAME, FAILED)
    assert outcome_from_config_map(config_map) == FAILED.outcome
    assert requests_from_config_map(config_map) == FAILED.requests
    assert json.loads(config_map["data"][REPORT_KEY]) == FAILED.body
    assert config_map["metadata"]["annotations"]["inference.dsv4.dev/verdict"] == "FAIL"


def test_the_whole_report_is_the_skeleton_plus_what_a_probe_files():
    skeleton = report_skeleton(OWNER, NAME)
    filing = report_filing(FAILED)
    whole = report_config_map(OWNER, NAME, FAILED)
    assert whole["data"] == filing["data"]
    assert whole["metadata"] == {**skeleton["metadata"], **filing["metadata"]}
    # Not a child the reconcile would prune; garbage-collected with the DSV4Deployment.
    assert LABEL_MANAGED_BY not in whole["metadata"]["labels"]
    assert whole["metadata"]["ownerReferences"][0]["uid"] == OWNER.uid


def test_a_report_without_a_verdict_yet_is_no_evidence():
    assert outcome_from_config_map(report_skeleton(OWNER, NAME)) is None
    assert requests_from_config_map(report_skeleton(OWNER, NAME)) == {}
    garbled = {"metadata": {"name": NAME}, "data": {"outcome.json": "{not json"}}
    assert outcome_from_config_map(garbled) is None


def test_an_attempt_without_a_probe_result_is_inconclusive_and_says_why():
    evidence = Evidence.inconclusive(NAME, "http://canary:8000", "probe Job ended (Complete)")
    outcome = outcome_from_config_map(report_config_map(OWNER, NAME, evidence))
    assert outcome is not None and outcome.verdict is RolloutVerdict.INCONCLUSIVE
    assert (outcome.rate, outcome.bound, outcome.samples) == (None, None, 0)
    assert outcome.message == "probe Job ended (Complete)"
    assert evidence.requests == {}  # no request was sent, none is counted
