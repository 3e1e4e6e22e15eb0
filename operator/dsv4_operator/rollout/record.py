"""The rollout's durable record on the children: which flags are stable, which each workload
runs, which were rejected.  It lets a lost `status.rollout` be rebuilt from the cluster
(`recover`) instead of from the spec — the spec is exactly what has not been tested.

Annotations, not labels: a EngineRevision is JSON.  They sit on the workload objects' own metadata,
never on their pod templates, so recording a decision never restarts a pod.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from dsv4_engine.features import Role
from dsv4_operator.api.rollout import EngineRevision, Slot
from dsv4_operator.render.meta import (
    ENGINE_KINDS,
    LABEL_COMPONENT,
    LABEL_GROUP_ROLE,
    LABEL_SLOT,
    WORKLOAD_KINDS,
)

ANNOTATION_STABLE = "inference.dsv4.dev/stable-flags"
ANNOTATION_RUNS = "inference.dsv4.dev/flags"
ANNOTATION_REJECTED = "inference.dsv4.dev/rejected-revision"


def _dump(flags: EngineRevision) -> str:
    return json.dumps(flags.model_dump(mode="json", by_alias=True), sort_keys=True)


def role_of(workload: dict[str, Any]) -> Role | None:
    """The engine role of a role's engine workload; None for anything else (a workers'
    StatefulSet of an older operator included)."""
    labels = workload["metadata"].get("labels") or {}
    if workload["kind"] not in ENGINE_KINDS or labels.get(LABEL_GROUP_ROLE) == "worker":
        return None
    component = labels.get(LABEL_COMPONENT)
    return Role(component) if component in tuple(Role) else None


def with_record(
    objects: list[dict[str, Any]],
    stable: EngineRevision,
    runs: dict[Role, EngineRevision],
    rejected: str | None,
) -> list[dict[str, Any]]:
    """``objects`` with the record on every workload: the stable flags, the rejected
    revision, and on each role's engine workload the flags that role runs."""
    out = []
    for obj in objects:
        if obj["kind"] not in WORKLOAD_KINDS:
            out.append(obj)
            continue
        meta = obj["metadata"]
        record = {ANNOTATION_STABLE: _dump(stable)}
        if rejected is not None:
            record[ANNOTATION_REJECTED] = rejected
        component = (meta.get("labels") or {}).get(LABEL_COMPONENT)
        if obj["kind"] in ENGINE_KINDS and component in tuple(Role):
            record[ANNOTATION_RUNS] = _dump(runs[Role(component)])
        annotations = {**meta.get("annotations", {}), **record}
        out.append({**obj, "metadata": {**meta, "annotations": annotations}})
    return out


def slot_of(workload: dict[str, Any]) -> Slot:
    """The slot a workload is in (made before slots existed: `blue`, where it always was)."""
    labels = workload["metadata"].get("labels") or {}
    return Slot(labels.get(LABEL_SLOT, Slot.BLUE.value))


@dataclass(frozen=True)
class Record:
    """What one live workload says (None: not recorded, or unreadable)."""

    name: str
    stable: EngineRevision | None
    runs: EngineRevision | None
    rejected: str | None

    @classmethod
    def of(cls, workload: dict[str, Any]) -> Record:
        annotations = workload["metadata"].get("annotations") or {}
        return cls(
            name=workload["metadata"]["name"],
            stable=_load(annotations.get(ANNOTATION_STABLE)),
            runs=_load(annotations.get(ANNOTATION_RUNS)),
            rejected=annotations.get(ANNOTATION_REJECTED),
        )


def _load(text: str | None) -> EngineRevision | None:
    if not text:
        return None
    try:
        return EngineRevision.model_validate_json(text)
    except ValidationError:
        return None


def recorded_revisions(workloads: list[dict[str, Any]]) -> dict[str, EngineRevision]:
    """Every revision the workloads record (stable or running), by revision: what a lost
    status can be rebuilt around, and so what its reports are re-checked against."""
    found: dict[str, EngineRevision] = {}
    for workload in workloads:
        record = Record.of(workload)
        for revision in (record.stable, record.runs):
            if revision is not None:
                found[revision.revision] = revision
    return found
