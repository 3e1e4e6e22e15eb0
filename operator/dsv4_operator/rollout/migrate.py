"""A `status.rollout` written before the engine revision, read as today's.

Operators before the engine revision recorded `stable` and `canary` as a flag set,
`{features, image}` (the image by name), and their revisions as a hash of that; every other
engine field was rolled into production straight from the spec.  So what such an operator
ran is exactly the live spec with the recorded features and image: that is the revision the
flag set is upgraded to, and its revision hash replaces the old one wherever the status
names it.  Without this, every deployment would lose its rollout state on the upgrade (the
children's old records do not parse either) and report `RolloutStateLost`.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import ValidationError

from dsv4_operator.api.rollout import EngineRevision
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.rollout.slices import spec_revision

# (the flag set's key, the key of its revision hash) in a status.rollout
_FLAG_SETS = (("stable", "stableRevision"), ("canary", "canaryRevision"))


def upgraded(raw: dict[str, Any], spec: DSV4DeploymentSpec) -> dict[str, Any]:
    """``raw`` with any old flag set upgraded to the engine revision it stood for (``raw``
    itself when it has none).  A rejected revision is renamed with the flag set it named;
    one that names neither is dropped (no record of what it was survives to rename it)."""
    if not any(_is_flag_set(raw.get(key)) for key, _ in _FLAG_SETS):
        return raw
    out = dict(raw)
    renamed: dict[str, str] = {}
    for key, revision_key in _FLAG_SETS:
        old = raw.get(key)
        if not _is_flag_set(old):
            continue
        new = _revision_of(old, spec)
        if isinstance(raw.get(revision_key), str):
            renamed[raw[revision_key]] = new.revision
        out[key] = new.model_dump(mode="json", by_alias=True)
        out[revision_key] = new.revision
    rejected = raw.get("rejectedRevision")
    if rejected is not None:
        if rejected in renamed:
            out["rejectedRevision"] = renamed[rejected]
        else:
            out.pop("rejectedRevision")
    return out


def _is_flag_set(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"features", "image"}


def _revision_of(flag_set: dict[str, Any], spec: DSV4DeploymentSpec) -> EngineRevision:
    """The revision an old operator ran for ``flag_set``: the live spec, its features and
    image name. Raises ValueError when the two cannot be a spec today."""
    data = copy.deepcopy(spec.model_dump(mode="json", by_alias=True))
    data["features"] = flag_set["features"]
    data["image"]["name"] = flag_set["image"]
    try:
        return spec_revision(DSV4DeploymentSpec.model_validate(data))
    except ValidationError as err:
        raise ValueError(f"an old flag set is no valid spec today: {err}") from None
