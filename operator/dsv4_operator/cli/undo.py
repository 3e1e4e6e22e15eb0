"""`dsv4ctl rollout undo NAME [--to-revision R] [--print-patch]`: production back to flags
that served it before, through the same surge promotion, without a canary.

The undo is one write: the spec edited to ask for those flags (their engine fields as they
served) and the rollout-action control naming them, so the operator never sees the one
without the other.  What may be returned to is checked here first, by the operator's own
rule (`rollout.undo`), so a refused undo never leaves the spec asking for flags that will
not run; the operator checks again when it acts.
"""

from __future__ import annotations

import json
import time
from typing import Any

from pydantic import ValidationError

from dsv4_engine.cliutil import CommandError
from dsv4_operator.api import KIND
from dsv4_operator.api.rollout import RolloutStatus
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.cli.kubeapi import whoami
from dsv4_operator.kube.client import Kube, path
from dsv4_operator.render.meta import Owner
from dsv4_operator.rollout import undo
from dsv4_operator.rollout.decide import ManualAction
from dsv4_operator.rollout.ledger import Ledger, ledger_name
from dsv4_operator.rollout.manual import annotations
from dsv4_operator.rollout.slices import spec_revision

MERGE_PATCH = "application/merge-patch+json"


def run(kube: Kube, obj: dict[str, Any], to_revision: str | None, print_patch: bool) -> int:
    namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    raw = (obj.get("status") or {}).get("rollout")
    if not raw:
        raise CommandError(f"{namespace}/{name}: no rollout recorded yet, nothing to undo", 1)
    try:
        status = RolloutStatus.model_validate(raw)
    except ValidationError as err:
        raise CommandError(f"{namespace}/{name}: status.rollout is unreadable: {err}", 1) from err
    owner = Owner(name, namespace, obj["metadata"]["uid"])
    ledger = Ledger.of(kube.get("ConfigMap", namespace, ledger_name(owner)))
    rejected = {revision: r.text() for revision, r in ledger.rejected.items()}
    target = to_revision or undo.default_target(status, rejected)
    if target is None:
        kept = ", ".join(h.revision for h in status.history) or "none"
        raise CommandError(
            f"{namespace}/{name}: no earlier revision to return to (history: {kept})", 1
        )
    refused = undo.refusal(status, target, rejected)
    if refused is not None:
        raise CommandError(f"{namespace}/{name}: undo to {target} refused: {refused}", 1)
    entry = undo.served(status, target)
    assert entry is not None  # `refusal` said it served
    patch = undo.spec_patch(entry)
    if print_patch:
        # What a GitOps repository must hold too, or its next sync asks for the undone flags.
        print(json.dumps(patch, indent=2))
        return 0
    asks = _asks_after(kube, namespace, name, patch)
    if asks != target:
        raise CommandError(
            f"{namespace}/{name}: the spec edited for the undo would ask for flags {asks}, "
            f"not {target} (the CRD's defaults changed since?); nothing was written",
            1,
        )
    control = annotations(ManualAction.UNDO, str(time.time_ns()), target, whoami(kube))
    body = {**patch, "metadata": {"annotations": control}}
    kube.request("PATCH", path(KIND, namespace, name), body=body, content_type=MERGE_PATCH)
    print(
        f"{namespace}/{name}: undo to flags {target} requested (served from "
        f"{entry.promoted_at}); `dsv4ctl rollout status {name} -n {namespace}` follows it"
    )
    return 0


def _asks_after(kube: Kube, namespace: str, name: str, patch: dict[str, Any]) -> str:
    """The revision the spec would ask for with ``patch``, as the API server would store it
    (a dry run: its defaults and admission applied, nothing written)."""
    dry = kube.request(
        "PATCH",
        path(KIND, namespace, name),
        body=patch,
        content_type=MERGE_PATCH,
        query=[("dryRun", "All")],
    )
    return spec_revision(DSV4DeploymentSpec.model_validate(dry["spec"])).revision
