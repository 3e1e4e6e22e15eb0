"""The e2e tests' in-process `kubectl get -o json` (tests/e2e/kubectl_get.py) prints what
kubectl prints, on a real API server: by plural, singular and short name, by name, by
label and field selector, in a namespace and cluster-wide, a CRD's short name, and the
same error for an object that is not there."""

from __future__ import annotations

import json

import pytest

from dsv4_dev.cluster.local import ClusterError, LocalCluster
from tests.e2e import kubectl_get
from tests.e2e.helpers import apply

NS = "kubectl-get-e2e"


@pytest.fixture(scope="module")
def world(crd: LocalCluster) -> LocalCluster:
    crd.kubectl("create", "namespace", NS)
    for n in range(3):
        cm = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"cm-{n}", "labels": {"e2e": "kubectl-get", "n": str(n)}},
            "data": {"n": str(n)},
        }
        apply(crd, cm, NS)
    return crd


def kubectl(cluster: LocalCluster, *args: str) -> dict:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


@pytest.mark.parametrize(
    "args",
    [
        ("configmaps", "-n", NS),
        ("configmap", "cm-1", "-n", NS),
        ("cm", "-n", NS, "-l", "e2e=kubectl-get,n!=2"),
        ("configmaps", f"--namespace={NS}", "--field-selector", "metadata.name=cm-0"),
        ("namespace", NS),
        ("crd", "dsv4deployments.inference.dsv4.dev"),
        ("dsv4", "-n", NS),
        ("serviceaccounts", "-n", NS, "--selector=none=here"),
    ],
)
def test_it_prints_what_kubectl_prints(world, args):
    q = kubectl_get.query(args)
    assert q is not None, "answered in process"
    assert kubectl_get.get_json(world, *args) == kubectl(world, *args)


@pytest.mark.parametrize(
    "args", [("all", "-n", NS), ("configmap/cm-1", "-n", NS), ("cm", "-n", NS, "-o", "wide")]
)
def test_what_it_does_not_read_is_left_to_kubectl(args):
    assert kubectl_get.query(args) is None


def test_an_object_not_there_fails_as_kubectl_does(world):
    with pytest.raises(ClusterError, match="NotFound|not found"):
        kubectl_get.get_json(world, "configmap", "absent", "-n", NS)
    with pytest.raises(ClusterError, match="not found"):
        world.kubectl("get", "configmap", "absent", "-n", NS)
