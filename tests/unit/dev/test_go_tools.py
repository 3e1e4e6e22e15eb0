"""hack/go-tools/go.mod pins the Go programs the tests run (the control plane, KWOK, the LWS
controller) in one module; the build scripts take their versions from it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
GO_MOD = (ROOT / "hack" / "go-tools" / "go.mod").read_text()


def required(module: str) -> str:
    found = re.findall(rf"^\s*{re.escape(module)} (v\S+)", GO_MOD, re.MULTILINE)
    assert len(found) == 1, (module, found)
    return found[0]


def bin_dir(script: str) -> Path:
    out = subprocess.run(
        [ROOT / "hack" / script, "--print-bin-dir"], capture_output=True, text=True, check=True
    )
    return Path(out.stdout.strip())


def test_each_kubernetes_staging_module_is_pinned_to_the_release_of_kubernetes():
    """k8s.io/kubernetes v1.Y.Z's go.mod points its staging modules at folders of its own
    repository; as a dependency they must be replaced by their releases, v0.Y.Z, or MVS
    would mix library versions Kubernetes was never built with."""
    staging = "v0." + required("k8s.io/kubernetes").removeprefix("v1.")
    replaced = dict(re.findall(r"^\s*(\S+) => (\S+ \S+)$", GO_MOD, re.MULTILINE))
    assert {"k8s.io/api", "k8s.io/apiserver", "k8s.io/client-go"} <= replaced.keys()
    for module, target in replaced.items():
        assert module.startswith("k8s.io/"), module
        assert target == f"{module} {staging}", module


def test_the_build_scripts_cache_by_the_pinned_versions():
    control_plane = bin_dir("build-control-plane.sh").name
    assert control_plane.startswith(
        f"{required('k8s.io/kubernetes')}-etcd{required('go.etcd.io/etcd/server/v3')}"
        f"-kwok{required('sigs.k8s.io/kwok')}-"
    )
    lws = bin_dir("build-lws.sh").name
    assert lws.startswith(f"lws-{required('sigs.k8s.io/lws')}-")
    # Both end in the same digest of go.sum: a changed pin is a new folder, built anew.
    assert control_plane.rsplit("-", 1)[1] == lws.rsplit("-", 1)[1]
