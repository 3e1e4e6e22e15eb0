"""Rejected revisions, remembered past the deployment: the ledger ConfigMap.

`status.rollout.rejectedRevision` holds one rejection, and lives and dies with the
DSV4Deployment.  That left two ways around the canary: recreate the deployment (or lose its
status and delete its workloads) and the spec's revision was adopted as stable, rejected or
not; reject A, change to B, change back to A, and A was tried afresh.  The ledger closes
both: every rejection is recorded in `<name>-revisions` (newest `MAX_REJECTED` kept), a
ConfigMap that deliberately has no owner reference, so it outlives the deployment and is
read again by one created under the same name.  A rejected revision starts no canary and is
never adopted as stable until a person runs the retry control (`dsv4ctl rollout retry`)
for it, which is the one thing that removes it.  Deleting the ConfigMap forgets everything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from dsv4_operator.render.meta import Owner, metadata

COMPONENT = "revisions"
KEY = "rejected.json"
MAX_REJECTED = 32


def ledger_name(owner: Owner) -> str:
    return f"{owner.name}-{COMPONENT}"


@dataclass(frozen=True)
class Rejection:
    verdict: str
    report: str | None
    at: str

    def text(self) -> str:
        report = f", report {self.report}" if self.report else ""
        return f"{self.verdict} at {self.at}{report}"


@dataclass(frozen=True)
class Ledger:
    """Revision → why it was rejected, oldest first."""

    rejected: dict[str, Rejection] = field(default_factory=dict)

    @classmethod
    def of(cls, config_map: dict[str, Any] | None) -> Ledger:
        """The ledger a ConfigMap holds; an unreadable entry is kept out, never guessed at
        (a hand edit that breaks it forgets only what it broke)."""
        if config_map is None:
            return cls()
        try:
            raw = json.loads((config_map.get("data") or {}).get(KEY) or "{}")
        except json.JSONDecodeError:
            return cls()
        rejected = {}
        for revision, entry in raw.items() if isinstance(raw, dict) else ():
            if isinstance(entry, dict) and isinstance(entry.get("verdict"), str):
                rejected[revision] = Rejection(
                    entry["verdict"], entry.get("report"), str(entry.get("at", ""))
                )
        return cls(rejected)

    def with_rejection(self, revision: str, rejection: Rejection) -> Ledger:
        if revision in self.rejected:
            return self
        kept = dict(list(self.rejected.items())[-(MAX_REJECTED - 1) :])
        return Ledger({**kept, revision: rejection})

    def without(self, revision: str) -> Ledger:
        return Ledger({k: v for k, v in self.rejected.items() if k != revision})


def ledger_config_map(owner: Owner, ledger: Ledger) -> dict[str, Any]:
    """The ledger as applied: managed by the operator, owned by no one (it must outlive
    the deployment)."""
    meta = metadata(owner, ledger_name(owner), COMPONENT)
    meta.pop("ownerReferences")
    body = {rev: vars(r) for rev, r in ledger.rejected.items()}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta,
        "data": {KEY: json.dumps(body)},  # insertion order: oldest first
    }
