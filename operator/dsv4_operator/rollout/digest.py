"""Which build a canary ran: the registry digests its engine pods report (`imageID`).

A tag names a build only until someone pushes another under it; a digest names one build
forever.  The canary's PASS is evidence about the build its pods ran, so that build — read
from the pods' status, as the kubelet reports what it pulled — is what production is pinned
to (`EngineRevision.image_digest`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dsv4_engine.features import Role
from dsv4_operator.render.meta import ENGINE_CONTAINER, LABEL_COMPONENT

PULLABLE = "docker-pullable://"


def registry_digest(image_id: str) -> str | None:
    """`repository@sha256:…` from a container's `imageID`, or None when it names no pullable
    build (empty, or a bare local image ID that no registry serves)."""
    reference = image_id.removeprefix(PULLABLE)
    repository, at, digest = reference.partition("@")
    if not at or not repository or not digest.startswith("sha256:"):
        return None
    return reference


@dataclass(frozen=True)
class Builds:
    """The builds a slice's engine pods ran: digests, and pods that reported none."""

    digests: frozenset[str] = frozenset()
    unpinned: tuple[str, ...] = ()  # pods whose engine container has no registry digest

    @classmethod
    def of(cls, pods: list[dict[str, Any]]) -> Builds:
        digests, unpinned = set(), []
        for pod in pods:
            if (pod["metadata"].get("labels") or {}).get(LABEL_COMPONENT) not in tuple(Role):
                continue
            for status in (pod.get("status") or {}).get("containerStatuses") or []:
                if status.get("name") != ENGINE_CONTAINER:
                    continue
                digest = registry_digest(status.get("imageID") or "")
                if digest is None:
                    unpinned.append(pod["metadata"]["name"])
                else:
                    digests.add(digest)
        return cls(frozenset(digests), tuple(sorted(unpinned)))
