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
    }
    assert node["spec"]["taints"] == [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    ]
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert len({n["metadata"]["name"] for n in nodes}) == 6
