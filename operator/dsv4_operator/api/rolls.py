"""How a change of each spec field reaches running pods: its rollout class.

Every field of `DSV4DeploymentSpec` carries one class, as `Annotated` metadata in the typed
model (`api.spec`), either on the field itself (the class of everything below it) or on each
field of its sub-model.  `classes` walks the model and refuses a field that has none, so a
new field cannot slip past the canary by being forgotten (tests/unit/operator/
test_op_rolls.py); docs/rollout.md's table is generated from the same walk.

The one class that matters most is `REVISION`: the fields that can change what an engine
computes or the prefill→decode wire format.  Together they are the engine revision
(`rollout.revision`), the only thing a canary proves and a promotion moves to production.
"""

from __future__ import annotations

import copy
import json
from enum import StrEnum
from typing import Any, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

Path = tuple[str, ...]  # camelCase field names from the spec's root, as the CRD writes them


class Rolls(StrEnum):
    """What a change of a field does to running pods."""

    REVISION = "revision"  # part of the engine revision: reaches production only via a canary
    CAPACITY = "capacity"  # how many and how big: rolled (or scaled) directly
    PLACEMENT = "placement"  # which nodes: rolled directly
    CONTROL = "control"  # how the operator itself acts (rollout, canary, deadlines): no pod rolls

    @property
    def meaning(self) -> str:
        return _MEANING[self]


_MEANING = {
    Rolls.REVISION: "engine revision: a canary proves it before production runs it",
    Rolls.CAPACITY: "capacity: applied to production directly",
    Rolls.PLACEMENT: "placement: applied to production directly",
    Rolls.CONTROL: "operator behaviour: no engine pod changes",
}


class Unclassified(TypeError):
    """A spec field without a rollout class (a programming error, caught by a unit test)."""


def _alias(name: str, info: FieldInfo) -> str:
    return info.alias or name


def _class_of(info: FieldInfo) -> Rolls | None:
    return next((m for m in info.metadata if isinstance(m, Rolls)), None)


def _sub_model(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds (through `X | None`), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) is not None:
        models = [m for a in get_args(annotation) if (m := _sub_model(a)) is not None]
        return models[0] if len(models) == 1 else None
    return None


def classes(model: type[BaseModel], prefix: Path = ()) -> dict[Path, Rolls]:
    """Every classified path of ``model``: a field's own class, or its sub-model's fields'.
    Raises `Unclassified` naming every field that has neither."""
    found: dict[Path, Rolls] = {}
    missing: list[str] = []
    for name, info in model.model_fields.items():
        path = (*prefix, _alias(name, info))
        own = _class_of(info)
        sub = _sub_model(info.annotation)
        if own is not None:
            found[path] = own
        elif sub is not None:
            try:
                found.update(classes(sub, path))
            except Unclassified as err:
                missing += err.args[0]
        else:
            missing.append(".".join(path))
    if missing:
        raise Unclassified(missing)
    return found


def _at(data: Any, path: Path) -> Any:
    """The value at ``path`` in nested dicts (None where it is not)."""
    for key in path:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def _parent(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """The dict that holds ``path``'s last key, made on the way where missing."""
    for key in path[:-1]:
        data = data.setdefault(key, {})
    return data


def project(data: dict[str, Any], paths: list[Path]) -> dict[str, Any]:
    """The part of ``data`` (a spec as JSON) at ``paths``, nested as in ``data``."""
    out: dict[str, Any] = {}
    for path in paths:
        _parent(out, path)[path[-1]] = _at(data, path)
    return out


def overlay(data: dict[str, Any], part: dict[str, Any], paths: list[Path]) -> dict[str, Any]:
    """``data`` with the values of ``part`` at ``paths`` (a copy; `project`'s inverse)."""
    out = copy.deepcopy(data)
    for path in paths:
        value, target = _at(part, path), _parent(out, path)
        if value is None:
            target.pop(path[-1], None)
        else:
            target[path[-1]] = value
    return out


def differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    """The fields that differ between two projections, as `path: old → new` (what a
    person reads in an Event: which engine fields a canary tests)."""
    if isinstance(old, dict) and isinstance(new, dict):
        found = []
        for key in sorted(set(old) | set(new)):
            path = f"{prefix}.{key}" if prefix else key
            found += differences(old.get(key), new.get(key), path)
        return found
    if old == new:
        return []
    return [f"{prefix}: {_shown(old)} → {_shown(new)}"]


def _shown(value: Any) -> str:
    return "unset" if value is None else json.dumps(value, sort_keys=True)
