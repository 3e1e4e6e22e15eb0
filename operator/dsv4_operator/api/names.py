"""Rules on a DSV4Deployment's own name: what its children's names need from it.

Enforced twice, like the spec's rules: by a CEL rule on the CRD's root (the API server
refuses the object) and by `name_problem` in the operator (for an object that got in
through an older CRD).
"""

from __future__ import annotations

from dsv4_operator.api.schema import cel

# Between a deployment's name and its canary slice's: a DSV4Deployment name may not contain
# "--", so no deployment's own children can ever be named like another deployment's canary
# slice (`X--canary-decode`, while a deployment `X-canary` has `X-canary-decode`).
CANARY_SUFFIX = "--canary"

NO_DOUBLE_HYPHEN = (
    f"metadata.name: must not contain '--' (reserved: a deployment's canary slice is named "
    f"<name>{CANARY_SUFFIX}, so no other deployment's children may be named like it)"
)


def name_rules() -> list[dict[str, str]]:
    """The root `x-kubernetes-validations` of the CRD."""
    return [cel("!self.metadata.name.contains('--')", NO_DOUBLE_HYPHEN)]


def name_problem(name: str) -> str | None:
    return NO_DOUBLE_HYPHEN if "--" in name else None
