"""Manual rollout controls travel as one annotation on the DSV4Deployment.

``inference.dsv4.dev/rollout-action: "<promote|abort|retry>/<token>/<revision>"``: the token
(a timestamp from `dsv4ctl rollout …`) makes a control act once — the operator records it in
`status.rollout.handledAction` and never acts on that token again; it does not write the
resource, so the annotation stays until the next `dsv4ctl rollout` overwrites it — and the
revision binds it to the flags it was meant for (the canary's, or the rejected ones for a
retry), so a control that outlives its rollout is refused instead of acting on the next one.

``inference.dsv4.dev/rollout-action-by`` says who asked, written with the control by `dsv4ctl`
(the user the API server authenticated, from a SelfSubjectReview).  The admission fence
(dsv4-rollout-actions) admits it only as the requester's own name, so the status and Events
name who asked; a control written without it is recorded as asked by someone unnamed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from dsv4_operator.rollout.decide import Manual, ManualAction

ANNOTATION = "inference.dsv4.dev/rollout-action"
BY_ANNOTATION = "inference.dsv4.dev/rollout-action-by"
# What `dsv4ctl rollout` writes is ~40 characters; the token is copied into the status
# (`handledAction`), so a longer annotation is refused, never copied (the admission fence,
# dsv4-rollout-actions, refuses it before it is stored).
MAX_CONTROL = 128


def encode(action: ManualAction, token: str, revision: str) -> str:
    return f"{action.value}/{token}/{revision}"


def annotations(action: ManualAction, token: str, revision: str, by: str | None) -> dict:
    """The annotations one control writes, together: the control, and who asked (None: not
    known, and a `by` left from an earlier control removed)."""
    return {ANNOTATION: encode(action, token, revision), BY_ANNOTATION: by}


def parse(annotations: Mapping[str, str] | None) -> Manual | None:
    """The control in the annotation.  One that cannot be parsed still acts once — as a
    refusal the operator reports — so a typo never sits there unexplained."""
    raw = (annotations or {}).get(ANNOTATION)
    if not raw:
        return None
    if len(raw) > MAX_CONTROL:
        digest = hashlib.sha256(raw.encode()).hexdigest()[:16]
        why = f"the annotation holds {len(raw)} characters; a control is at most {MAX_CONTROL}"
        return Manual(ManualAction.ABORT, f"sha256:{digest}", error=why)
    action, _, rest = raw.partition("/")
    token, _, revision = rest.partition("/")
    try:
        kind = ManualAction(action.strip())
    except ValueError:
        known = ", ".join(a.value for a in ManualAction)
        return Manual(ManualAction.ABORT, raw, error=f"unknown action {action!r} (one of {known})")
    by = (annotations or {}).get(BY_ANNOTATION) or None
    return Manual(kind, token.strip() or raw, revision.strip() or None, by=by)
