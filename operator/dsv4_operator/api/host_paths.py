"""Which host paths a deployment may read its model from: only those under a prefix the
operator's administrator allows (`dsv4-operator run --allowed-model-host-paths`).

A hostPath volume reads the node's own filesystem, so whoever may create a DSV4Deployment
would otherwise choose any directory of any GPU node for its pods to mount.  The
recommended source is a PersistentVolumeClaim, mounted read-only; a host path is accepted
only under an allowed prefix, compared component by component (`/data/models` allows
`/data/models/v4`, not `/data/models-old`), and never with `..` in it.  Without the flag no
host path is allowed.  (Symbolic links on the node are the node administrator's: this is a
check of the path as written, which is what the kubelet mounts from.)

The nodes are shared and the list is cluster-wide, so an entry may be scoped to one
namespace: `tenant-a=/data/models/tenant-a` allows that directory to deployments in
`tenant-a` only, where a bare `/data/models` allows it to every namespace the operator
serves.  Give each tenant its own directory, scoped: otherwise one tenant's deployment can
mount another's weights.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

FLAG = "--allowed-model-host-paths"
ENV = "DSV4_ALLOWED_MODEL_HOST_PATHS"  # the flag's default
FIELD = "spec.model.hostPath"


SCOPE = "="  # `NAMESPACE=PREFIX`
_NAMESPACE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


def parse_prefixes(text: str) -> tuple[str, ...]:
    """A comma-separated list of absolute directories, each bare or `NAMESPACE=DIRECTORY`;
    ValueError says what is wrong."""
    entries = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        namespace, scoped, directory = item.rpartition(SCOPE)
        if scoped and _NAMESPACE.match(namespace) is None:
            raise ValueError(f"{FLAG}: {item!r}: {namespace!r} is not a namespace name")
        path = PurePosixPath(directory)
        if not path.is_absolute() or ".." in path.parts:
            raise ValueError(f"{FLAG}: {item!r} is not an absolute path without '..'")
        entries.append(f"{namespace}{SCOPE}{path}" if scoped else str(path))
    return tuple(entries)


def prefixes_for(namespace: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """The directories ``allowed`` (parsed entries) allows in ``namespace``."""
    found = []
    for entry in allowed:
        scope, scoped, directory = entry.rpartition(SCOPE)
        if not scoped or scope == namespace:
            found.append(directory)
    return tuple(found)


def host_path_problem(path: str, namespace: str, allowed: tuple[str, ...]) -> str | None:
    """Why ``path`` may not be mounted in ``namespace``; None when it lies under a prefix
    allowed there."""
    candidate = PurePosixPath(path)
    if not candidate.is_absolute() or ".." in candidate.parts:
        return f"{FIELD}: {path!r} must be an absolute path without '..'"
    here = prefixes_for(namespace, allowed)
    for prefix in here:
        if candidate == PurePosixPath(prefix) or PurePosixPath(prefix) in candidate.parents:
            return None
    listed = ", ".join(here) if here else "none"
    return (
        f"{FIELD}: {path} is not under a host path the operator allows in namespace "
        f"{namespace} ({FLAG}: {listed}); read the model from a PersistentVolumeClaim "
        "(spec.model.pvc), or ask the operator's administrator to allow the directory here"
    )
