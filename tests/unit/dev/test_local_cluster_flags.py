"""The local cluster's component flags reach kwokctl in an order kwokctl v0.8.0 can file."""

from __future__ import annotations

import subprocess

import pytest

from dsv4_dev.cluster import local
from dsv4_dev.cluster.local import SERVICE_IP_RANGE, ClusterError, LocalCluster, _extra_args


def _filed(args: list[str]) -> dict[str, list[str]]:
    """What kwokctl v0.8.0's `mutationComponentPatches` does with --extra-args: a
    component's later flags go to the patch at the index its first flag had among all
    the flags (an index past the list of patches is its panic)."""
    patches: list[tuple[str, list[str]]] = []
    first_at: dict[str, int] = {}
    for i, arg in enumerate(args):
        component, flag = arg.removeprefix("--extra-args=").split("=", 1)
        if component in first_at:
            patches[first_at[component]][1].append(flag)  # IndexError: kwokctl panics
            continue
        first_at[component] = i
        patches.append((component, [flag]))
    return dict(patches)


def test_each_component_gets_its_own_flags():
    flags = LocalCluster(controller_qps=200)._component_flags()
    filed = _filed(_extra_args(flags))
    assert filed == {
        "kube-apiserver": [f"service-cluster-ip-range={SERVICE_IP_RANGE}"],
        "kube-controller-manager": ["leader-elect=false", "kube-api-qps=200", "kube-api-burst=400"],
        "kube-scheduler": ["leader-elect=false", "kube-api-qps=200", "kube-api-burst=400"],
    }


def test_the_default_cluster_keeps_the_components_rates_and_elects_no_leader():
    filed = _filed(_extra_args(LocalCluster()._component_flags()))
    assert filed["kube-controller-manager"] == filed["kube-scheduler"] == ["leader-elect=false"]


def test_flags_one_component_after_another_would_make_kwokctl_panic():
    """The order `_extra_args` avoids (what the first version of the bench sent): the
    scheduler's second flag is filed past the end of the list."""
    naive = [
        "--extra-args=kube-controller-manager=kube-api-qps=1",
        "--extra-args=kube-controller-manager=kube-api-burst=2",
        "--extra-args=kube-scheduler=kube-api-qps=1",
        "--extra-args=kube-scheduler=kube-api-burst=2",
    ]
    with pytest.raises(IndexError):
        _filed(naive)


def test_an_apply_is_tried_again_after_a_dropped_connection_and_not_after_a_refusal(
    tmp_path, monkeypatch
):
    """A kube-apiserver just started under load dropped a connection (`EOF`) as the e2e
    cluster registered its nodes; that apply is tried again, a real refusal is not."""
    cluster = LocalCluster(name="retry", workdir=tmp_path)
    answers = [
        subprocess.CompletedProcess([], 1, "", 'Get "https://127.0.0.1:1/openapi/v2": EOF'),
        subprocess.CompletedProcess([], 0, "", ""),
        subprocess.CompletedProcess([], 1, "", 'error: nodes "x" is invalid'),
    ]
    calls = []

    def kubectl(*args, **kwargs):
        calls.append(args)
        return answers[len(calls) - 1]

    monkeypatch.setattr(cluster, "kubectl", kubectl)
    monkeypatch.setattr(local.time, "sleep", lambda s: None)
    cluster.apply_retrying("{}")
    assert len(calls) == 2
    with pytest.raises(ClusterError, match="is invalid"):
        cluster.apply_retrying("{}")
    assert len(calls) == 3
