"""CEL rules in the typed models: how a model carries its `x-kubernetes-validations`."""

from __future__ import annotations

from pydantic import ConfigDict


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    """One `x-kubernetes-validations` entry; the message names the field it is about."""
    entry = {"rule": rule, "message": message}
    if field_path is not None:
        entry["fieldPath"] = field_path
    return entry


def validations(*rules: dict[str, str]) -> ConfigDict:
    return ConfigDict(json_schema_extra={"x-kubernetes-validations": list(rules)})
