"""Generate the DSV4Deployment CRD (crds/dsv4deployment.yaml) from the typed models.

Why a converter and not pydantic's schema as is: the API server wants a *structural*
OpenAPI v3 schema (no `$ref`, no `anyOf` for optional fields, `exclusiveMinimum` and
`exclusiveMaximum` as booleans, free-form maps marked `x-kubernetes-preserve-unknown-fields`).  The CEL rules
ride along from the models' `x-kubernetes-validations`.

`python -m dsv4_operator.api.crd [PATH]` (`make manifests`) writes the file; a unit test
fails when the committed file differs from what this module generates.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from dsv4_operator.api import CRD_NAME, GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION
from dsv4_operator.api.names import name_rules
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.api.status import DSV4DeploymentStatus

CRD_PATH = Path(__file__).resolve().parents[3] / "crds" / "dsv4deployment.yaml"

_KEEP = (
    "type",
    "description",
    "enum",
    "pattern",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "format",
)

# The one role a CRD's single `scale` subresource can scale (`kubectl scale dsv4 NAME`, a
# HorizontalPodAutoscaler's scaleTargetRef): decode, whose load follows concurrent sessions.
# Its status gives the ready replicas and the selector of its serving pods.
SCALE = {
    "specReplicasPath": ".spec.decode.replicas",
    "statusReplicasPath": ".status.decode.ready",
    "labelSelectorPath": ".status.decode.selector",
}

PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Prefill", "type": "string", "jsonPath": ".status.prefill.summary"},
    {"name": "Decode", "type": "string", "jsonPath": ".status.decode.summary"},
    {"name": "HiCache", "type": "boolean", "jsonPath": ".status.activeFeatures.hicache.enabled"},
    {"name": "IndexDtype", "type": "string", "jsonPath": ".status.activeFeatures.indexDtype"},
    {"name": "Canary", "type": "string", "jsonPath": ".status.rollout.phase"},
    {"name": "Transfer", "type": "string", "jsonPath": ".status.rollout.transfer"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Inline `$ref` and collapse `anyOf: [X, null]` (an optional field) into X."""
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[1]]
        rest = {k: v for k, v in node.items() if k != "$ref"}
        return _resolve({**target, **rest}, defs)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot make a structural schema of anyOf {node['anyOf']}")
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        return _resolve({**options[0], **rest}, defs)
    return node


def structural(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """One pydantic JSON-schema node as a Kubernetes structural schema node."""
    node = _resolve(node, defs)
    out = {k: node[k] for k in _KEEP if k in node}
    if "exclusiveMinimum" in node:
        out["minimum"], out["exclusiveMinimum"] = node["exclusiveMinimum"], True
    if "exclusiveMaximum" in node:
        out["maximum"], out["exclusiveMaximum"] = node["exclusiveMaximum"], True
    out.update({k: v for k, v in node.items() if k.startswith("x-kubernetes-")})
    kind = node.get("type")
    if kind == "object":
        properties = node.get("properties")
        extra = node.get("additionalProperties")
        if properties:
            out["properties"] = {k: structural(v, defs) for k, v in properties.items()}
            if node.get("required"):
                out["required"] = list(node["required"])
        elif isinstance(extra, dict) and extra:
            out["additionalProperties"] = structural(extra, defs)
        else:
            out["x-kubernetes-preserve-unknown-fields"] = True
    elif kind == "array":
        out["items"] = structural(node["items"], defs)
    default = node.get("default")
    if default is not None:
        # Spelled out in full: the API server checks a default against the CEL rules
        # before it would fill in nested defaults, so `{}` would fail `hicache.enabled`.
        out["default"] = _without_nulls(default)
    return out


def _without_nulls(value: Any) -> Any:
    """Unset optional fields are absent, not null, in a Kubernetes object."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return value


def _schema_of(model: type) -> dict[str, Any]:
    schema = model.model_json_schema(by_alias=True, mode="validation")
    return structural(schema, schema.get("$defs", {}))


def build_crd() -> dict[str, Any]:
    spec = _schema_of(DSV4DeploymentSpec)
    status = _schema_of(DSV4DeploymentStatus)
    # The operator alone writes the status, a whole decision at a time: as one atomic value
    # to field management its managed fields are one entry (`f:status`), not one per leaf,
    # and the API server's work on every status write is ~25% less (docs/dsv4deployment.md#scale).
    status["x-kubernetes-map-type"] = "atomic"
    root = {
        "type": "object",
        "description": "A DeepSeek-V4 prefill/decode deployment on SGLang.",
        "required": ["spec"],
        "x-kubernetes-validations": name_rules(),
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}, "scale": SCALE},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


class _NoAliasDumper(yaml.SafeDumper):
    """Spell shared sub-schemas (prefill and decode) out in full: no YAML anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render_crd_yaml() -> str:
    header = "# Generated by `make manifests` from operator/dsv4_operator/api/; do not edit.\n"
    body = yaml.dump(
        build_crd(), Dumper=_NoAliasDumper, sort_keys=False, width=100, allow_unicode=True
    )
    return header + body


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else CRD_PATH
    path.write_text(render_crd_yaml())
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
