"""Waiting for a CustomResourceDefinition to be Established.

Not `kubectl wait --for=condition=Established`: on a CRD created a moment ago, whose status
has no conditions yet, kubectl 1.36 fails at once (".status.conditions accessor error")
instead of waiting — seen failing a whole e2e module's fixture on a loaded machine.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

_JSONPATH = '{.status.conditions[?(@.type=="Established")].status}'


def established(
    kubectl: Callable[..., subprocess.CompletedProcess[str]], crd: str, timeout: float = 60
) -> str | None:
    """Poll ``crd`` (`crd/<plural>.<group>`) until Established; None when it is, else why
    not after ``timeout`` seconds (the caller raises its own error)."""
    deadline = time.monotonic() + timeout
    while True:
        found = kubectl("get", crd, "-o", f"jsonpath={_JSONPATH}", check=False)
        if found.stdout.strip() == "True":
            return None
        if time.monotonic() > deadline:
            return f"{crd} not Established within {timeout:.0f}s {found.stderr.strip()}".strip()
        time.sleep(0.5)
