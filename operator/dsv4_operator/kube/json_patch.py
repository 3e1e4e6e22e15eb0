"""The smallest JSON patch (RFC 6902) from one document to another.

The reconciler writes a deployment's status as the JSON patch from what the API server
holds to what the pass decided, not as a server-side apply of the whole status: most
passes change a condition or two, and the request then carries those fields alone, with no
server-side-apply merge of the whole status (`make bench-scale` measures what the operator
adds to the cluster's own work).  A JSON patch and not a merge patch (RFC 7386): a merge
patch cannot write a null, and a rollout's revisions are hashes of spec fields that may be
null.
"""

from __future__ import annotations

import json
from typing import Any


def pointer(*keys: str) -> str:
    """A JSON pointer (RFC 6901) to ``keys``: `~` and `/` inside a key escaped."""
    return "".join("/" + k.replace("~", "~0").replace("/", "~1") for k in keys)


def json_patch(old: dict[str, Any], new: dict[str, Any], at: str = "") -> list[dict[str, Any]]:
    """The operations that turn object ``old`` (at pointer ``at``) into ``new``: objects are
    compared key by key, any other value (a list included) replaced whole when it differs
    in the least (`1` and `1.0`, `true` and `1` differ: JSON tells them apart)."""
    ops: list[dict[str, Any]] = [
        {"op": "remove", "path": at + pointer(key)} for key in old if key not in new
    ]
    for key, value in new.items():
        path = at + pointer(key)
        if key not in old:
            ops.append({"op": "add", "path": path, "value": value})
        elif isinstance(value, dict) and isinstance(old[key], dict):
            ops += json_patch(old[key], value, path)
        elif _text(old[key]) != _text(value):
            ops.append({"op": "replace", "path": path, "value": value})
    return ops


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
