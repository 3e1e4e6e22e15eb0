"""Manual rollout controls travel as one annotation on the DSV4Deployment.

``inference.dsv4.dev/rollout-action: "<promote|abort|retry>/<token>"``: the token (a
timestamp from `dsv4ctl rollout …`) lets the operator act on a retry exactly once, however
often it reconciles, while promote/abort simply apply to the rollout in progress.
"""

from __future__ import annotations

from collections.abc import Mapping

from dsv4_operator.rollout.decide import Manual, ManualAction

ANNOTATION = "inference.dsv4.dev/rollout-action"


def encode(action: ManualAction, token: str) -> str:
    return f"{action.value}/{token}"


def parse(annotations: Mapping[str, str] | None) -> Manual | None:
    """The request in the annotation; an unknown action is ignored (and logged by the caller)."""
    raw = (annotations or {}).get(ANNOTATION)
    if not raw:
        return None
    action, _, token = raw.partition("/")
    try:
        return Manual(ManualAction(action.strip()), token.strip())
    except ValueError:
        return None
