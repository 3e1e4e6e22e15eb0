"""A canary serves once its router Service has a ready endpoint, read from the Kubernetes
API (EndpointSlices): the operator never calls an engine or router itself."""

from __future__ import annotations

from typing import Any

import pytest

from dsv4_operator.render.meta import Owner
from dsv4_operator.rollout.controller import SERVICE_NAME_LABEL, RolloutController
from dsv4_operator.rollout.slices import canary_url

OWNER = Owner(name="flash", namespace="serving", uid="uid-1")
SERVICE, PORT = canary_url(OWNER)


class Slices:
    """The API's EndpointSlices of one namespace, answering a label-selector list."""

    def __init__(self, *slices: dict[str, Any]) -> None:
        self.slices = slices
        self.lists: list[tuple[str, str, str]] = []

    def list(self, kind: str, namespace: str, selector: str) -> list[dict[str, Any]]:
        self.lists.append((kind, namespace, selector))
        key, value = selector.split("=")
        return [s for s in self.slices if s["metadata"]["labels"].get(key) == value]


def endpoint_slice(service: str, port: int, *ready: bool) -> dict[str, Any]:
    return {
        "metadata": {"labels": {SERVICE_NAME_LABEL: service}},
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": r}} for r in ready],
    }


@pytest.mark.parametrize(
    ("slices", "serving"),
    [
        ((), False),  # no endpoint yet
        ((endpoint_slice(SERVICE, PORT, False),), False),  # a router not Ready
        ((endpoint_slice(SERVICE, PORT, False, True),), True),
        ((endpoint_slice(SERVICE, PORT + 1, True),), False),  # another port
        ((endpoint_slice("flash-router", PORT, True),), False),  # the stable router
    ],
)
def test_the_canary_serves_once_its_router_service_has_a_ready_endpoint(slices, serving):
    kube = Slices(*slices)
    controller = RolloutController(kube, kube, executor=None)  # type: ignore[arg-type]
    assert controller._endpoint_ready(OWNER.namespace, SERVICE, PORT) is serving
    assert kube.lists == [("EndpointSlice", "serving", f"{SERVICE_NAME_LABEL}={SERVICE}")]
