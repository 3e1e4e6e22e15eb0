"""The transfer key: the prefill→decode wire format a spec's engines speak, derived from
both roles' resolved engine configuration (`dsv4_engine.wire`), never declared.

Engines of equal keys can hand requests over; of different keys they cannot, so a change
of the key is promoted in prefill+decode pairs (docs/rollout.md) and a router only ever
discovers engines of its own key (the key is a label on every engine pod and in the
router's selectors).  The key reads only revision-class fields (`api.rolls`), so a
revision's key is the key of any spec rendered from it.
"""

from __future__ import annotations

import hashlib
import json

from dsv4_engine.features import Role
from dsv4_engine.wire import wire_format
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.render.engine import engine_config

KEY_LENGTH = 12  # hex digits: a label value, and plenty to tell formats apart


def wire_formats(spec: DSV4DeploymentSpec) -> dict[str, object]:
    """What the key is made of: each role's wire format, and where the weights come from
    (two sources mounted at one path are two models)."""
    model = spec.model
    source = {
        "pvc": model.pvc.model_dump(mode="json", by_alias=True) if model.pvc else None,
        "hostPath": model.host_path,
        "preset": model.preset.value,
    }
    roles = {
        role.value: wire_format(
            engine_config(spec, role),
            [(e.name, e.value) for e in spec.role_spec(role).env],
            spec.image.name,
        )
        for role in Role
    }
    return {"weights": source, **roles}


def transfer_key(spec: DSV4DeploymentSpec) -> str:
    body = json.dumps(wire_formats(spec), sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:KEY_LENGTH]
