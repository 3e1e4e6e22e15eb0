"""Known-bad combinations: each entry refused with its id and link, accepted once
acknowledged, unrelated specs accepted; the matcher reads arguments as SGLang's parser does.

The same cases go to the real API server in tests/e2e/test_known_issues.py."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from dsv4_operator.api import known_issues
from dsv4_operator.api.errors import first_error
from dsv4_operator.api.known_issues import PINNED, All, Condition, Flag, SetsFlag
from dsv4_operator.api.samples import load_sample, merge_patch, shipped_sample
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.cli.main import main
from dsv4_operator.rollout.slices import spec_revision, with_revision

CASES = yaml.safe_load((Path(__file__).parents[2] / "data" / "known_issue_cases.yaml").read_text())
REFUSED = [case for case in CASES if case["refused"]]
BY_ID = {issue.id: issue for issue in PINNED}


def spec_of(case: dict, acknowledged: list[str] | None = None) -> dict:
    patch = dict(case["patch"])
    if acknowledged is not None:
        patch["acknowledgedKnownIssues"] = acknowledged
    return merge_patch(load_sample()["spec"], patch)


def refusal_of(spec: dict) -> str | None:
    """The operator's own verdict on a spec: None, or its one-line error."""
    try:
        DSV4DeploymentSpec.model_validate(spec)
    except ValidationError as err:
        return first_error(err)
    return None


def test_every_pinned_entry_has_an_upstream_link_and_a_refused_case():
    for issue in PINNED:
        assert re.match(r"^https://github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+$", issue.link)
        assert issue.id in {case["refused"] for case in REFUSED}, issue.id
    assert len(BY_ID) == len(PINNED)  # ids are unique


@pytest.mark.parametrize("case", REFUSED, ids=[c["name"] for c in REFUSED])
def test_a_matching_spec_is_refused_naming_the_field_the_entry_and_its_link(case):
    issue = BY_ID[case["refused"]]
    message = refusal_of(spec_of(case))
    assert message is not None, "accepted"
    assert message.startswith(case["field"] + ": "), message
    assert issue.id in message and issue.link in message
    assert f'add "{issue.id}" to spec.acknowledgedKnownIssues' in message


@pytest.mark.parametrize("case", REFUSED, ids=[c["name"] for c in REFUSED])
def test_an_acknowledged_entry_is_accepted(case):
    assert refusal_of(spec_of(case, [case["refused"]])) is None


@pytest.mark.parametrize(
    "case",
    [c for c in CASES if not c["refused"]],
    ids=[c["name"] for c in CASES if not c["refused"]],
)
def test_a_spec_that_matches_no_entry_is_accepted(case):
    assert refusal_of(spec_of(case)) is None


@pytest.mark.parametrize(
    "name", ["flash-b200-1p1d", "pro-gb200-nvl72", "flash-reference", "flash-echo"]
)
def test_the_shipped_samples_match_no_entry(name):
    spec = DSV4DeploymentSpec.model_validate(shipped_sample(name)["spec"])
    assert known_issues.matches(spec.model_dump(mode="json", by_alias=True)) == []


def test_a_running_revision_acknowledged_once_is_rebuilt_after_the_live_spec_moved_on():
    """The stable revision needed an acknowledgement; the live spec moved to flags that do
    not and dropped it: the stable pods (live spec + stable revision) are still rendered,
    while the same combination asked for anew is refused."""
    fp4 = next(c for c in REFUSED if c["refused"] == "sglang-35811-hicache-fp4-indexer")
    stable = spec_revision(DSV4DeploymentSpec.model_validate(spec_of(fp4, [fp4["refused"]])))
    live = DSV4DeploymentSpec.model_validate(load_sample()["spec"])
    running = with_revision(live, stable)
    assert running.features.index_dtype.value == "fp4" and running.acknowledged_known_issues == ()
    assert refusal_of(running.model_dump(mode="json", by_alias=True)) is not None


def test_an_unknown_id_acknowledges_nothing_and_a_malformed_one_is_refused():
    case = BY_ID["sglang-35811-hicache-fp4-indexer"]
    fp4 = next(c for c in REFUSED if c["refused"] == case.id)
    assert refusal_of(spec_of(fp4, ["sglang-35811"])) is not None
    message = refusal_of(spec_of(fp4, ["Not An Id"]))
    assert message is not None and message.startswith("spec.acknowledgedKnownIssues.0"), message


DETERMINISTIC = SetsFlag(
    ("prefill", "extraArgs"),
    (Flag("--enable-deterministic-inference", "--enable-det"),),
)
TRTLLM = SetsFlag(("prefill", "extraArgs"), (Flag("--dsv4-attn-backend", "--dsv4-a"),), ("trtllm",))


@pytest.mark.parametrize(
    ("condition", "args", "sets"),
    [
        (DETERMINISTIC, ["--enable-deterministic-inference"], True),
        (DETERMINISTIC, ["--enable-det"], True),
        (DETERMINISTIC, ["--enable-de"], False),  # shorter than SGLang's parser resolves
        (DETERMINISTIC, ["--enable-deterministic-inference-x"], False),
        (DETERMINISTIC, ["--tp", "--enable-determinist"], True),
        (DETERMINISTIC, ["x--enable-deterministic-inference"], False),
        (TRTLLM, ["--dsv4-attn-backend", "trtllm"], True),
        (TRTLLM, ["--dsv4-att=trtllm"], True),
        (TRTLLM, ["--dsv4-attn-backend=trtllm-gen"], False),
        (TRTLLM, ["--dsv4-attn-backend", "flashmla", "trtllm"], False),
        (TRTLLM, ["--dsv4-attn-backend"], False),
        (TRTLLM, [], False),
    ],
)
def test_an_argument_sets_a_flag_as_argparse_reads_it(condition, args, sets):
    assert condition.holds({"prefill": {"extraArgs": args}}) is sets


def test_the_rules_are_one_per_check_at_the_checks_field():
    rules = known_issues.rules()
    assert len(rules) == sum(len(issue.checks) for issue in PINNED)
    for rule, (issue, check) in zip(rules, [(i, c) for i in PINNED for c in i.checks], strict=True):
        assert rule["fieldPath"] == "." + ".".join(check.field)
        assert rule["message"] == issue.message(check)
        assert rule["rule"].startswith(f"'{issue.id}' in self.acknowledgedKnownIssues || ")


def test_dsv4ctl_render_refuses_a_known_issue_in_one_line(tmp_path, capsys):
    case = next(c for c in REFUSED if c["refused"] == "sglang-37838-trtllm-attention-pd")
    path = tmp_path / "flash.yaml"
    path.write_text(yaml.safe_dump(merge_patch(load_sample(), {"spec": case["patch"]})))
    assert main(["render", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"{case['field']}: " in err and BY_ID[case["refused"]].link in err


def parts(condition: Condition) -> list[Condition]:
    """A condition and everything under it."""
    below = condition.conditions if isinstance(condition, All) else ()
    return [condition, *(p for c in below for p in parts(c))]


@pytest.mark.sglang
def test_each_flag_and_value_is_read_so_by_sglangs_own_parser():
    """`Flag.shortest` is the shortest abbreviation SGLang 0.5.23's parser resolves to the
    flag (every longer prefix too; one shorter does not), and every value is a choice."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    options = [o for action in parser._actions for o in action.option_strings]
    conditions = [
        part
        for issue in PINNED
        for check in issue.checks
        for part in parts(check.when)
        if isinstance(part, SetsFlag)
    ]
    assert conditions
    for condition in conditions:
        for flag in condition.flags:
            action = parser._option_string_actions[flag.name]
            for n in range(len(flag.shortest), len(flag.name) + 1):
                prefix = flag.name[:n]
                assert prefix in action.option_strings or [
                    o for o in options if o.startswith(prefix)
                ] == [flag.name], prefix
            shorter = [o for o in options if o.startswith(flag.shortest[:-1])]
            assert shorter != [flag.name], flag
            assert set(condition.values) <= set(action.choices or condition.values), flag
