"""The name budget is the real one: at the limit every child — canary and multi-node workers
included — can have pods; one character more and some pod's label cannot exist.

What Kubernetes derives from a child's name and must keep within 63 characters: the
`controller-revision-hash` label (`<StatefulSet>-<decimal FNV-32>`, up to 10 digits), the
`statefulset.kubernetes.io/pod-name` label and the pod's hostname (`<StatefulSet>-<ordinal>`),
Service names (DNS-1035 labels) and the instance label the operator sets.
"""

import re

import pytest
from pydantic import ValidationError

from dsv4_engine.features import Role
from dsv4_operator.api.crd import build_crd
from dsv4_operator.api.names import (
    MULTINODE_MAX,
    NO_DOUBLE_HYPHEN,
    NOT_A_DNS_LABEL,
    SINGLE_NODE_MAX,
    TOO_LONG,
    TOO_LONG_MULTINODE,
    name_problem,
)
from dsv4_operator.api.rollout import CanarySpec, Slot
from dsv4_operator.api.samples import load_sample, merge_patch, shipped_sample
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.render import render_all, render_slot
from dsv4_operator.render.meta import LABEL_INSTANCE, Owner
from dsv4_operator.rollout.slices import as_canary, canary_owner, canary_spec, spec_revision

LABEL_MAX = 63
DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
# The longest hash `HashControllerRevision` can write: the largest uint32 in decimal.
LONGEST_REVISION_HASH = str(2**32 - 1)
# The largest group index a LeaderWorkerSet can have (spec: replicas <= 1024, checked below).
LAST_GROUP = 1023

SINGLE = DSV4DeploymentSpec.model_validate(load_sample()["spec"])
MULTI = DSV4DeploymentSpec.model_validate(shipped_sample("pro-gb200-nvl72")["spec"])


def both_slices(name: str, spec: DSV4DeploymentSpec) -> list[dict]:
    """Both slices, and the stable engines in both slots (a paired promotion's green one)."""
    owner = Owner(name=name, namespace="serving", uid="uid-1")
    canary = canary_spec(spec, spec_revision(spec), CanarySpec())
    canary_children = as_canary(owner, render_all(canary_owner(owner), canary))
    return render_all(owner, spec) + render_slot(owner, spec, Slot.GREEN) + canary_children


def derived_labels(objects: list[dict]) -> list[str]:
    """Every label value and DNS name Kubernetes makes from the children's names."""
    out = []
    for obj in objects:
        meta = obj["metadata"]
        out.append(meta["labels"][LABEL_INSTANCE])
        if obj["kind"] == "Service":
            out.append(meta["name"])
        if obj["kind"] == "StatefulSet":
            out.append(f"{meta['name']}-{LONGEST_REVISION_HASH}")  # controller-revision-hash
            out.append(f"{meta['name']}-{obj['spec']['replicas'] - 1}")  # the last pod's name
        if obj["kind"] == "LeaderWorkerSet":
            # LWS makes StatefulSet <lws> (leaders <lws>-<group>) and, per group, the
            # workers' StatefulSet <lws>-<group> (pods <lws>-<group>-<index>).
            workers = f"{meta['name']}-{LAST_GROUP}"
            size = obj["spec"]["leaderWorkerTemplate"]["size"]
            out.append(f"{meta['name']}-{LONGEST_REVISION_HASH}")
            out.append(workers)
            out.append(f"{workers}-{LONGEST_REVISION_HASH}")
            out.append(f"{workers}-{size - 1}")
    return out


@pytest.mark.parametrize(("spec", "limit"), [(SINGLE, SINGLE_NODE_MAX), (MULTI, MULTINODE_MAX)])
def test_at_the_limit_every_derived_label_fits_and_one_past_it_one_does_not(spec, limit):
    assert spec.multinode is (limit == MULTINODE_MAX)
    at_limit = derived_labels(both_slices("a" * limit, spec))
    assert all(len(v) <= LABEL_MAX and DNS_1035.fullmatch(v) for v in at_limit), at_limit
    past = derived_labels(both_slices("a" * (limit + 1), spec))
    too_long = [v for v in past if len(v) > LABEL_MAX]
    assert too_long, "the budget is looser than it needs to be"
    assert all("--canary-prefill" in v for v in too_long), too_long  # the canary's set
    assert name_problem("a" * limit, spec.multinode) is None
    expected = TOO_LONG_MULTINODE if spec.multinode else TOO_LONG
    assert name_problem("a" * (limit + 1), spec.multinode) == expected


def test_the_limits():
    # 63 - len("-4294967295") - len("--canary") - len("-prefill") [- len("-1023")]
    assert (SINGLE_NODE_MAX, MULTINODE_MAX) == (36, 31)
    assert max(len(f"-{r.value}") for r in Role) == len("-prefill")
    past_last_group = merge_patch(
        shipped_sample("pro-gb200-nvl72")["spec"], {"decode": {"replicas": LAST_GROUP + 2}}
    )
    with pytest.raises(ValidationError, match="less than or equal to 1024"):
        DSV4DeploymentSpec.model_validate(past_last_group)


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("flash--canary", NO_DOUBLE_HYPHEN),
        ("Flash", NOT_A_DNS_LABEL),
        ("1flash", NOT_A_DNS_LABEL),
        ("flash.v2", NOT_A_DNS_LABEL),
        ("flash-", NOT_A_DNS_LABEL),
        ("flash-canary", None),
        ("f", None),
    ],
)
def test_name_rules(name, problem):
    assert name_problem(name, multinode=False) == problem


def test_the_crd_carries_the_same_rules_with_the_same_numbers():
    rules = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"][
        "x-kubernetes-validations"
    ]
    messages = [r["message"] for r in rules]
    assert messages == [NO_DOUBLE_HYPHEN, NOT_A_DNS_LABEL, TOO_LONG, TOO_LONG_MULTINODE]
    assert f"size() <= {SINGLE_NODE_MAX}" in rules[2]["rule"]
    assert f"size() <= {MULTINODE_MAX}" in rules[3]["rule"]
    assert "metadata.name: at most 36 characters" in TOO_LONG
    assert "metadata.name: at most 31 characters when a role has nodesPerReplica > 1" in (
        TOO_LONG_MULTINODE
    )


def test_a_multinode_spec_is_one_with_a_role_over_one_node():
    one = merge_patch(load_sample()["spec"], {"decode": {"nodesPerReplica": 2, "tp": 8}})
    assert DSV4DeploymentSpec.model_validate(one).multinode
    assert not SINGLE.multinode
