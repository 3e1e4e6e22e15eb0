"""Undo: production back to flags that served it before, without a canary.

Those flags were proven twice already: by the canary (or adopted when the deployment was
made) and by serving, watched, with no corruption found.  What may be returned to, and the
spec edit that asks for it, are decided here once, for the operator (`decide`, which acts
on the control) and for `dsv4ctl rollout undo` (which refuses before it edits the spec, so
a refused undo never leaves the spec asking for flags that will not run).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dsv4_operator.api.rollout import IN_PROGRESS, PromotedRevision, RolloutStatus


def served(status: RolloutStatus, revision: str | None) -> PromotedRevision | None:
    """The history entry of ``revision``, if it served here (within the history's limit)."""
    return next((h for h in status.history if h.revision == revision), None)


def refusal(status: RolloutStatus, revision: str, rejected: Mapping[str, str]) -> str | None:
    """Why production may not return to ``revision`` now, or None.  ``rejected``: revision →
    why, as the ledger keeps them (`rollout.ledger`)."""
    if status.phase in IN_PROGRESS:
        return f"a rollout of flags {status.canary_revision} is in progress (abort it first)"
    if revision == status.stable_revision:
        return f"flags {revision} already serve"
    entry = served(status, revision)
    if entry is None:
        kept = ", ".join(h.revision for h in status.history) or "none recorded"
        return f"flags {revision} never served here (history: {kept})"
    if entry.corruption is not None:
        return (
            f"the production watch found corruption while flags {revision} served: "
            f"{entry.corruption}"
        )
    if revision in rejected or revision == status.rejected_revision:
        why = rejected.get(revision) or (status.verdict.value if status.verdict else "rejected")
        return f"flags {revision} were rejected ({why}); `dsv4ctl rollout retry` tests them again"
    return None


def default_target(status: RolloutStatus, rejected: Mapping[str, str]) -> str | None:
    """The newest revision production may return to: what `undo` without `--to-revision`
    means."""
    return next(
        (h.revision for h in status.history if refusal(status, h.revision, rejected) is None),
        None,
    )


def spec_patch(entry: PromotedRevision) -> dict[str, Any]:
    """The JSON merge patch that makes a spec ask for ``entry``'s flags: their engine fields
    as they served (a field unset then is removed, null in the patch); every other field
    (replicas, placement, the rollout's own settings) stays as it is."""
    return {"spec": entry.flags.spec}
