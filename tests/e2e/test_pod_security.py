"""Every pod the operator renders for every shipped sample meets the Pod Security level
docs/install.md states for it, as the real API server's Pod Security admission judges it:
`restricted`, unless it mounts its model from a hostPath or adds IPC_LOCK (an RDMA role),
which only `privileged` admits — and `baseline` refuses, so that is the lowest level.

Each pod (engines, both LeaderWorkerSet templates, routers, the canary's, a probe Job's:
`tests/unit/install/rendered.py`) is created as a server-side dry run in a namespace that
enforces its level, and a privileged one also in one that enforces `baseline`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from dsv4_dev.cluster.local import LocalCluster
from dsv4_operator.render.meta import LABEL_COMPONENT
from dsv4_operator.render.security import IPC_LOCK
from tests.unit.install.rendered import SAMPLES, pod_templates, rendered

LEVELS = ("restricted", "baseline", "privileged")
ENFORCE = "pod-security.kubernetes.io/enforce"


def stated_level(pod: dict[str, Any]) -> str:
    """docs/install.md, "Security": `restricted`, but a hostPath model or an RDMA role's
    IPC_LOCK needs `privileged`."""
    host_path = any("hostPath" in v for v in pod.get("volumes", []))
    added = {
        cap
        for c in pod["containers"]
        for cap in c.get("securityContext", {}).get("capabilities", {}).get("add", [])
    }
    return "privileged" if host_path or IPC_LOCK in added else "restricted"


@pytest.fixture(scope="module")
def namespaces(cluster: LocalCluster) -> Iterator[dict[str, str]]:
    """A namespace enforcing each level, holding the ServiceAccounts the pods run as."""
    names = {level: f"psa-{level}" for level in LEVELS}
    accounts = {
        o["metadata"]["name"] for s in SAMPLES for o in rendered(s) if o["kind"] == "ServiceAccount"
    }
    try:
        for level, name in names.items():
            namespace = {"apiVersion": "v1", "kind": "Namespace"}
            namespace["metadata"] = {"name": name, "labels": {ENFORCE: level}}
            cluster.kubectl("apply", "-f", "-", input=json.dumps(namespace))
            for account in sorted(accounts):
                meta = {"name": account, "namespace": name}
                body = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta}
                cluster.kubectl("apply", "-f", "-", input=json.dumps(body))
        yield names
    finally:
        for name in names.values():
            cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def admission(cluster: LocalCluster, namespace: str, template: dict[str, Any]):
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "psa-", "labels": template["metadata"]["labels"]},
        "spec": template["spec"],
    }
    return cluster.kubectl(
        "create", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(pod),
        check=False,
    )  # fmt: skip


@pytest.mark.parametrize("sample", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_every_rendered_pod_meets_the_level_the_docs_state(cluster, namespaces, sample):
    seen = set()
    for workload, template in pod_templates(rendered(sample)):
        name = workload["metadata"]["name"]
        level = stated_level(template["spec"])
        seen.add((workload["metadata"]["labels"][LABEL_COMPONENT], level))
        result = admission(cluster, namespaces[level], template)
        assert result.returncode == 0, (name, level, result.stderr)
        assert "PodSecurity" not in result.stderr, result.stderr  # not even a warning
        if level == "privileged":
            beyond = admission(cluster, namespaces["baseline"], template)
            assert beyond.returncode != 0 and "violates PodSecurity" in beyond.stderr, name
    # Routers and probes are `restricted` everywhere; an engine role is `privileged` exactly
    # when the spec gives it a hostPath model or an RDMA device, as the docs say.
    spec = yaml.safe_load(sample.read_text())["spec"]
    expected = {("router", "restricted"), ("probe", "restricted")}
    for role in ("prefill", "decode"):
        beyond = "hostPath" in spec["model"] or spec[role].get("resources", {}).get("rdma")
        expected.add((role, "privileged" if beyond else "restricted"))
    assert seen == expected
