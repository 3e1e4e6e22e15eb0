"""The sample DSV4Deployments shipped in crds/samples/, and RFC 7386 merge patches of them.

Tests and tools build variants of a sample (a bad field, another replica count) as
`merge_patch(load_sample(...), patch)` rather than keeping near-copies of the YAML.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
SAMPLES_DIR = ROOT / "crds" / "samples"
# What users apply: the samples the docs point at (manifests/samples/*.yaml).
SHIPPED_DIR = ROOT / "manifests" / "samples"


def load_sample(name: str = "b200-1p1d") -> dict[str, Any]:
    return yaml.safe_load((SAMPLES_DIR / f"{name}.yaml").read_text())


def shipped_sample(name: str) -> dict[str, Any]:
    """A sample as users get it (tests that must run on the shipped defaults use these)."""
    return yaml.safe_load((SHIPPED_DIR / f"{name}.yaml").read_text())


def merge_patch(doc: Any, patch: Any) -> Any:
    """JSON merge patch (RFC 7386): objects merge key by key, null deletes, the rest replaces."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(doc) if isinstance(doc, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged
