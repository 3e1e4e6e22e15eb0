"""kopf's wiring: kopf hands the DSV4Deployments' events to the controller and keeps no
diff state for them, which is right only while no registered handler reads a diff."""

from __future__ import annotations

from typing import Any

import kopf

from dsv4_operator.api import GROUP, PLURAL, VERSION
from dsv4_operator.reconcile import handlers


class EventsOnly:
    """Stands in for the Controller: `register` hands it the events only."""

    def deployment_event(self, kind: str | None, obj: dict[str, Any]) -> None:
        raise AssertionError("not called by registering")


def test_no_registered_handler_reads_the_diff_kopf_is_told_not_to_keep() -> None:
    registry = kopf.OperatorRegistry()
    handlers.register(registry, EventsOnly())  # type: ignore[arg-type]
    resource = kopf.Resource(GROUP, VERSION, PLURAL)
    assert registry._watching.has_handlers(resource=resource)
    # kopf diffs old and new essences for change and daemon handlers only: with one of
    # these, NoDiffBase would hand it an empty diff and it would never fire.
    assert not registry._changing.has_handlers(resource=resource)
    assert not registry._spawning.has_handlers(resource=resource)
    assert isinstance(handlers.settings().persistence.diffbase_storage, handlers.NoDiffBase)
