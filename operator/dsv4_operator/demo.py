"""`make demo`: the main job on the embedded default.

Today it brings up the local control plane with fake Blackwell nodes and shows them; the
canary-rollout demo (issue 8) extends this module.  The cluster stays up afterwards so it
can be explored with the printed kubeconfig; `make cluster-down` stops it.
"""

from __future__ import annotations

import sys

from dsv4_operator.cluster.binaries import MissingBinaryError
from dsv4_operator.cluster.local import ClusterError, LocalCluster


def main() -> int:
    cluster = LocalCluster()
    try:
        cluster.up(log=lambda message: print(f"demo: {message}"))
        print(
            cluster.kubectl(
                "get", "nodes", "-L", "nvidia.com/gpu.product,nvidia.com/gpu.count"
            ).stdout
        )
    except (ClusterError, MissingBinaryError) as err:
        print(f"demo: error: {err}", file=sys.stderr)
        return 1
    print(f"demo: export KUBECONFIG={cluster.kubeconfig}   # explore with kubectl")
    print("demo: make cluster-down                        # stop everything")
    return 0


if __name__ == "__main__":
    sys.exit(main())
