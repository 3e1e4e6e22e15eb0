"""Each deployment's spec as its last pass parsed it, and the engine revision it asks for.

Every pass parses its deployment's spec (the schema's rules, SGLang's refusals, the known
issues) and derives the revision the spec asks for: a fifth to a quarter of a settled
pass's CPU, for a spec that changes only when someone edits it.  So the last parse is kept
per deployment (by uid), keyed by the spec exactly as the API server sent it: a pass whose spec is the
same bytes gets the same parse, any edit is parsed anew.  A spec that does not parse is not
kept (its error is raised again, every pass, as before).  Passes share the kept models:
nothing changes a model in place (a changed spec is a `model_copy`)."""

from __future__ import annotations

import functools
import threading
from typing import Any

import orjson

from dsv4_operator.api.rollout import EngineRevision
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.rollout.slices import spec_revision


class ParsedSpec:
    """A parsed spec and, once asked for, the revision it asks for."""

    def __init__(self, spec: DSV4DeploymentSpec) -> None:
        self.spec = spec

    @functools.cached_property
    def asked(self) -> EngineRevision:
        """`spec_revision`, derived on the first ask (a pass that stops before its rollout
        never asks, and deriving it can fail as the rollout's own errors do)."""
        return spec_revision(self.spec)


class SpecMemory:
    """The last `ParsedSpec` of each deployment, by uid; `forget` drops a deleted one's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # passes of different deployments run in parallel
        self._by_uid: dict[str, tuple[bytes, ParsedSpec]] = {}

    def parse(self, uid: str, raw: dict[str, Any]) -> ParsedSpec:
        """``raw`` parsed (`DSV4DeploymentSpec`; its ValidationError raised), or the parse
        kept from the same bytes."""
        key = orjson.dumps(raw)
        with self._lock:
            kept = self._by_uid.get(uid)
        if kept is not None and kept[0] == key:
            return kept[1]
        parsed = ParsedSpec(DSV4DeploymentSpec.model_validate(raw))
        with self._lock:
            self._by_uid[uid] = (key, parsed)
        return parsed

    def forget(self, uid: str) -> None:
        with self._lock:
            self._by_uid.pop(uid, None)

    def __len__(self) -> int:
        return len(self._by_uid)
