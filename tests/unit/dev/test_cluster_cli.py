"""`dsv4ctl cluster` errors are one clear line, and node manifests have the GPU shape."""

from __future__ import annotations

import socket

import pytest

from dsv4_dev.cluster.nodes import default_pools, node_manifests
from dsv4_operator.cli.main import main


def test_missing_binary_names_it_and_the_fix(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DSV4_BIN_DIR", str(tmp_path / "empty"))
    code = main(["cluster", "--name", "x", "--workdir", str(tmp_path), "up"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "kube-apiserver not found" in err and "make control-plane" in err


def test_port_in_use_is_refused_before_starting_anything(tmp_path, capsys):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        code = main(
            ["cluster", "--name", "x", "--workdir", str(tmp_path), "up", "--port", str(port)]
        )
    err = capsys.readouterr().err
    assert code == 1
    assert f"port {port} for kube-apiserver is already in use" in err
    assert not (tmp_path / "clusters" / "x").exists()


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--gpu-nodes", "-1", "expected an integer >= 0, got -1"),
        ("--gpus-per-node", "0", "expected an integer >= 1, got 0"),
        ("--port", "70000", "expected an integer 1-65535, got 70000"),
        ("--cpu-nodes", "two", "expected an integer, got 'two'"),
    ],
)
def test_bad_flag_values_are_usage_errors(capsys, flag, value, message):
    with pytest.raises(SystemExit) as exit_:
        main(["cluster", "up", flag, value])
    assert exit_.value.code == 2
    assert f"argument {flag}: {message}" in capsys.readouterr().err


def test_gpu_nodes_have_labels_capacity_and_taint():
    nodes = node_manifests(default_pools(gpu_nodes=4, gpu_product="NVIDIA-GB200", cpu_nodes=2))
    gpu = [n for n in nodes if "nvidia.com/gpu.product" in n["metadata"]["labels"]]
    assert len(gpu) == 4 and len(nodes) == 6
    node = gpu[0]
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-GB200"
    assert node["metadata"]["labels"]["nvidia.com/gpu.count"] == "8"
    assert node["status"]["allocatable"] == {
        "cpu": "224",
        "memory": "2Ti",
        "pods": "110",
        "ephemeral-storage": "4Ti",
        "nvidia.com/gpu": "8",
        "rdma/ib": "8",
        "hugepages-1Gi": "64Gi",
    }
    assert node["spec"]["taints"] == [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    ]
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert len({n["metadata"]["name"] for n in nodes}) == 6


def test_gb200_nodes_split_into_cliques_of_consecutive_trays():
    pools = default_pools(gpu_nodes=36, gpu_product="NVIDIA-GB200", gpus_per_node=4, gpu_cliques=2)
    gpu = [n for n in node_manifests(pools) if "nvidia.com/gpu.product" in n["metadata"]["labels"]]
    cliques = [n["metadata"]["labels"]["nvidia.com/gpu.clique"] for n in gpu]
    assert len(set(cliques)) == 2
    assert cliques[:18] == [cliques[0]] * 18 and cliques[18:] == [cliques[18]] * 18
    plain = node_manifests(default_pools(gpu_nodes=2))
    assert not any("nvidia.com/gpu.clique" in n["metadata"]["labels"] for n in plain)


def test_more_cliques_than_gpu_nodes_is_one_line_naming_the_flag(tmp_path, capsys):
    code = main(
        ["cluster", "--name", "x", "--workdir", str(tmp_path), "up"]
        + ["--gpu-nodes", "2", "--gpu-cliques", "3"]
    )
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1, err
    assert "--gpu-cliques 3: must be between 0 and --gpu-nodes (2)" in err


def test_missing_lws_controller_names_it_and_the_fix(tmp_path, monkeypatch):
    from dsv4_dev.cluster.binaries import MissingBinaryError, lws_file

    monkeypatch.setenv("DSV4_LWS_DIR", str(tmp_path / "empty"))
    with pytest.raises(MissingBinaryError, match="lws-controller not found .*make control-plane"):
        lws_file("lws-controller")
