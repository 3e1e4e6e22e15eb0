"""Rules on a DSV4Deployment's own name: what its children's names need from it.

Enforced twice, like the spec's rules: by CEL rules on the CRD's root (the API server
refuses the object) and by `name_problem` in the operator (for an object that got in
through an older CRD).

The length budget is the one Kubernetes itself imposes on the longest child, not a guess:
the StatefulSet controller labels every pod `controller-revision-hash: <StatefulSet
name>-<hash>` (`pkg/controller/history`: `ControllerRevisionName(prefix, hash)`, the hash an
FNV-32 sum written in decimal, up to 10 characters), and a label value has at most 63.  A
name one character too long is accepted, its StatefulSet too, and then no pod can ever be
created (`FailedCreate`); the longest StatefulSet is the canary's (its suffix is longer than
the green slot's, `<name>-prefill-green`, which `test_op_names` renders too), and for a
multi-node role the workers' set LeaderWorkerSet makes for each group,
`<lws>-<group index>`: `<name>--canary-prefill-1023`.
"""

from __future__ import annotations

import re

from dsv4_engine.features import Role
from dsv4_operator.api.schema import cel

# Between a deployment's name and its canary slice's: a DSV4Deployment name may not contain
# "--", so no deployment's own children can ever be named like another deployment's canary
# slice (`X--canary-decode`, while a deployment `X-canary` has `X-canary-decode`).
CANARY_SUFFIX = "--canary"
# A multi-node role's LeaderWorkerSet `<name>-<role>` makes one workers' StatefulSet per
# group (replica), `<name>-<role>-<group index>`; replicas are at most 1024 (api.spec).
MAX_ROLE_REPLICAS = 1024
GROUP_SUFFIX = f"-{MAX_ROLE_REPLICAS - 1}"

LABEL_VALUE_MAX = 63
# What the StatefulSet controller appends to a StatefulSet's name in its pods'
# `controller-revision-hash` label: "-" and a decimal FNV-32 hash (at most 4294967295).
REVISION_HASH_SUFFIX = len("-4294967295")
# Role StatefulSets are `<name>-<role>` (render.engine.role_name).
LONGEST_ROLE_SUFFIX = max(len(f"-{role.value}") for role in Role)


def max_name_length(multinode: bool) -> int:
    """The longest DSV4Deployment name whose every child (canary included) can have pods."""
    longest_set = len(CANARY_SUFFIX) + LONGEST_ROLE_SUFFIX
    if multinode:
        longest_set += len(GROUP_SUFFIX)
    return LABEL_VALUE_MAX - REVISION_HASH_SUFFIX - longest_set


SINGLE_NODE_MAX = max_name_length(multinode=False)
MULTINODE_MAX = max_name_length(multinode=True)

NO_DOUBLE_HYPHEN = (
    f"metadata.name: must not contain '--' (reserved: a deployment's canary slice is named "
    f"<name>{CANARY_SUFFIX}, so no other deployment's children may be named like it)"
)
DNS_LABEL = "^[a-z]([-a-z0-9]*[a-z0-9])?$"
NOT_A_DNS_LABEL = (
    "metadata.name: must start with a lowercase letter and contain only lowercase letters, "
    "digits and '-' (it names the deployment's Services, which must be DNS-1035 labels)"
)
_WHY_LONG = (
    f"its longest child, the canary StatefulSet <name>{CANARY_SUFFIX}-prefill"
    "{group}, plus the '-<hash>' Kubernetes appends for its pods' "
    f"controller-revision-hash label, must fit a {LABEL_VALUE_MAX}-character label value"
)
TOO_LONG = f"metadata.name: at most {SINGLE_NODE_MAX} characters: " + _WHY_LONG.format(group="")
TOO_LONG_MULTINODE = (
    f"metadata.name: at most {MULTINODE_MAX} characters when a role has nodesPerReplica > 1: "
    + _WHY_LONG.format(group="-<group index>")
)

_MULTINODE_CEL = " || ".join(
    f"(has(self.spec.{role.value}) && has(self.spec.{role.value}.nodesPerReplica) && "
    f"self.spec.{role.value}.nodesPerReplica > 1)"
    for role in Role
)


def name_rules() -> list[dict[str, str]]:
    """The root `x-kubernetes-validations` of the CRD."""
    return [
        cel("!self.metadata.name.contains('--')", NO_DOUBLE_HYPHEN),
        cel(f"self.metadata.name.matches('{DNS_LABEL}')", NOT_A_DNS_LABEL),
        cel(f"self.metadata.name.size() <= {SINGLE_NODE_MAX}", TOO_LONG),
        cel(
            f"!has(self.spec) || !({_MULTINODE_CEL}) || "
            f"self.metadata.name.size() <= {MULTINODE_MAX}",
            TOO_LONG_MULTINODE,
        ),
    ]


def name_problem(name: str, multinode: bool) -> str | None:
    """The first rule ``name`` breaks (the same rules, in the same order, as the CRD's);
    ``multinode``: a role of the spec has nodesPerReplica > 1."""
    if "--" in name:
        return NO_DOUBLE_HYPHEN
    if re.fullmatch(DNS_LABEL, name) is None:
        return NOT_A_DNS_LABEL
    if len(name) > SINGLE_NODE_MAX:
        return TOO_LONG
    if multinode and len(name) > MULTINODE_MAX:
        return TOO_LONG_MULTINODE
    return None
