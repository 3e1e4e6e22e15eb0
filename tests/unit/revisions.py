"""Engine revisions for tests that need one: the spec's own derivation, never a hand-made
copy (`rollout.slices.spec_revision`), from a small reference-engine spec."""

from __future__ import annotations

from typing import Any

from dsv4_engine.features import EngineFeatures
from dsv4_operator.api.rollout import EngineRevision
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.rollout.slices import spec_revision

BASE: dict[str, Any] = {
    "engine": "reference",
    "model": {"hostPath": "/data/models/flash", "servedModelName": "flash"},
    "image": {"name": "engine:1"},
    "prefill": {"tp": 1, "gpusPerNode": 1},
    "decode": {"tp": 1, "gpusPerNode": 1},
}


def base_spec(**changes: Any) -> DSV4DeploymentSpec:
    return DSV4DeploymentSpec.model_validate({**BASE, **changes})


def revision(
    features: EngineFeatures | None = None, image: str = "engine:1", **changes: Any
) -> EngineRevision:
    """The revision of the base spec with ``features``, ``image`` and other top-level spec
    ``changes`` (camelCase, as the CRD writes them)."""
    spec = base_spec(image={"name": image}, **changes)
    if features is not None:
        spec = spec.model_copy(update={"features": features})
    return spec_revision(spec)
