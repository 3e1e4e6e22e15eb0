"""Which host paths a deployment may read its model from: only those under a prefix the
operator's administrator allows (`dsv4-operator run --allowed-model-host-paths`).

A hostPath volume reads the node's own filesystem, so whoever may create a DSV4Deployment
would otherwise choose any directory of any GPU node for its pods to mount.  The
recommended source is a PersistentVolumeClaim, mounted read-only; a host path is accepted
only under an allowed prefix, compared component by component (`/data/models` allows
`/data/models/v4`, not `/data/models-old`), and never with `..` in it.  Without the flag no
host path is allowed.  (Symbolic links on the node are the node administrator's: this is a
check of the path as written, which is what the kubelet mounts from.)
"""

from __future__ import annotations

from pathlib import PurePosixPath

FLAG = "--allowed-model-host-paths"
ENV = "DSV4_ALLOWED_MODEL_HOST_PATHS"  # the flag's default
FIELD = "spec.model.hostPath"


def parse_prefixes(text: str) -> tuple[str, ...]:
    """A comma-separated list of absolute directories; ValueError says what is wrong."""
    prefixes = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        path = PurePosixPath(item)
        if not path.is_absolute() or ".." in path.parts:
            raise ValueError(f"{FLAG}: {item!r} is not an absolute path without '..'")
        prefixes.append(str(path))
    return tuple(prefixes)


def host_path_problem(path: str, allowed: tuple[str, ...]) -> str | None:
    """Why ``path`` may not be mounted; None when it lies under an allowed prefix."""
    candidate = PurePosixPath(path)
    if not candidate.is_absolute() or ".." in candidate.parts:
        return f"{FIELD}: {path!r} must be an absolute path without '..'"
    for prefix in allowed:
        if candidate == PurePosixPath(prefix) or PurePosixPath(prefix) in candidate.parents:
            return None
    listed = ", ".join(allowed) if allowed else "none"
    return (
        f"{FIELD}: {path} is not under a host path the operator allows ({FLAG}: {listed}); "
        "read the model from a PersistentVolumeClaim (spec.model.pvc), or ask the "
        "operator's administrator to allow the directory"
    )
