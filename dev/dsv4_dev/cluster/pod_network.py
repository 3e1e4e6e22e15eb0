"""The pods a local runtime runs get addresses of their own on this machine.

On a real node every pod has its own network namespace, so every engine binds the ports
the operator rendered (30000, the bootstrap port 8998) and sglang-router, discovering
pods by label, reaches each at ``http://<podIP>:<port>``.  Here each cluster takes a block
of `NETWORK` (RFC 2544's benchmarking range, which no real network routes), made local to
this machine by one route on the loopback device (`local_route`: `ip route replace local
198.18.0.0/15 dev lo`, as root): the local runtime binds each pod's process to the pod's
own IP and the rendered ports, the real router finds it where Kubernetes says it is, and
the API server keeps the pod in its Services' EndpointSlices as it would a real pod's.
Where the route cannot be added (no CAP_NET_ADMIN), the block is on 127.0.0.0/8, which
Linux routes to the loopback device anyway; the API server refuses loopback addresses in
EndpointSlices, so the runtime's pods then stay out of them, and an operator that waits for
a Service's ready endpoint (the image's, not the development launcher's) waits for ever.

The local runtime picks the IP of each pod it runs from its cluster's `runtime_range`,
before the pod is scheduled (the process must answer before the pod is Ready:
`localrun.readiness`), and writes it into the pod's `POD_IP_ANNOTATION`; KWOK's pod-ready
stage, patched once when the cluster is created (`annotated_pod_ips`), makes a pod's IP
that annotation's value when it has one.  The runtime finds its range in the `PUBLISHED`
ConfigMap.  The pods KWOK plays alone keep the IPs KWOK gives them (10.0.0.x, where
nothing answers).

Clusters run side by side on one machine (make test keeps three, a developer's beside
them), so each cluster claims a slot (one block) machine-wide, under a lock: a claim is a
file naming the cluster's folder, and a slot whose cluster folder no longer holds the same
claim is free again (a cluster deleted, or a test's temporary folder gone).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

NETWORK = ipaddress.ip_network("198.18.0.0/15")
BLOCK_PREFIX = 21  # 2,048 addresses a cluster
SLOTS = range(2 ** (BLOCK_PREFIX - NETWORK.prefixlen))  # 64
CLAIM_FILE = "pod-network"
POD_IP_ANNOTATION = "inference.dsv4.dev/local-pod-ip"
# Where a cluster says which addresses its local runtime hands out (`runtime_range`).
PUBLISHED = ("default", "dsv4-local-pod-network")
RANGE_KEY = "runtimeRange"
# KWOK v0.8.0's pod-ready stage asks for a pod's IPs with this call (kustomize/stage/pod/
# fast/pod-ready.yaml); the patch lets the annotation, when set, override its answer.
_POD_IPS = "{{ $podIPs := PodIPsWith "
_OVERRIDE = (
    "{{ with .metadata.annotations }}{{ with index . "
    f'"{POD_IP_ANNOTATION}" }}}}{{{{ $podIPs = list . }}}}{{{{ end }}}}{{{{ end }}}}'
)


def runtime_range(slot: int, routed: bool = True) -> str:
    """The addresses the local runtime hands out for ``slot``: its block of `NETWORK`, or
    (not ``routed``) of 127.0.0.0/8."""
    if not routed:
        return f"127.{slot + 1}.0.0/16"
    return str(list(NETWORK.subnets(new_prefix=BLOCK_PREFIX))[slot])


def address(slot: int) -> str:
    """An address of ``slot``'s block (its first), made local where it can be: for a
    process a test runs outside any cluster, under a slot it claimed."""
    return str(next(ipaddress.ip_network(runtime_range(slot, local_route())).hosts()))


def local_route() -> bool:
    """Make `NETWORK` local to this machine (idempotent); False when it cannot be."""
    ip = shutil.which("ip")
    if ip is None:
        return False
    done = subprocess.run(
        [ip, "route", "replace", "local", str(NETWORK), "dev", "lo"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.returncode == 0


def annotated_pod_ips(kwok_config: str) -> str | None:
    """KWOK's saved cluster configuration with its pod-ready stage honouring
    `POD_IP_ANNOTATION`; None when it already does.  Raises ValueError when the stage does
    not ask for pod IPs the way KWOK v0.8.0 does (another KWOK: look at its stage)."""
    if POD_IP_ANNOTATION in kwok_config:
        return None
    lines, found = [], 0
    for line in kwok_config.splitlines():
        lines.append(line)
        if _POD_IPS in line:
            found += 1
            indent = line[: len(line) - len(line.lstrip())]
            lines.append(indent + _OVERRIDE)
    if not found:
        raise ValueError(f"KWOK's pod stages do not contain {_POD_IPS.strip()!r}: cannot patch")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def _locked(claims: Path) -> Iterator[None]:
    claims.mkdir(parents=True, exist_ok=True)
    with (claims / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _holder(claims: Path, slot: int) -> Path | None:
    """The cluster folder that holds ``slot``, or None when the slot is free."""
    try:
        folder = Path((claims / str(slot)).read_text().strip())
    except OSError:
        return None
    try:
        held = int((folder / CLAIM_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    return folder if held == slot else None


def claim(claims: Path, cluster_dir: Path) -> int:
    """The slot of the cluster in ``cluster_dir``: the one it holds, else a free one, now
    claimed (``claims``: the machine-wide folder of claims)."""
    with _locked(claims):
        try:
            slot = int((cluster_dir / CLAIM_FILE).read_text().strip())
            if _holder(claims, slot) == cluster_dir:
                return slot
        except (OSError, ValueError):
            pass
        for slot in SLOTS:
            if _holder(claims, slot) is None:
                cluster_dir.mkdir(parents=True, exist_ok=True)
                (cluster_dir / CLAIM_FILE).write_text(f"{slot}\n")
                (claims / str(slot)).write_text(f"{cluster_dir}\n")
                return slot
    raise RuntimeError(f"no free pod network: all {len(SLOTS)} slots under {claims} are claimed")


def release(claims: Path, cluster_dir: Path) -> None:
    """Give the cluster's slot back (nothing if it holds none)."""
    with _locked(claims):
        try:
            slot = int((cluster_dir / CLAIM_FILE).read_text().strip())
        except (OSError, ValueError):
            return
        if _holder(claims, slot) == cluster_dir:
            (claims / str(slot)).unlink(missing_ok=True)
        (cluster_dir / CLAIM_FILE).unlink(missing_ok=True)
