"""`dsv4ctl cluster url` and `status` read the local runtime's endpoint map as people name it."""

from __future__ import annotations

import pytest

from dsv4_dev.cli.cluster import _print_engines
from dsv4_dev.cluster.engines import Engines
from dsv4_dev.cluster.local import ClusterError, LocalCluster
from dsv4_dev.localrun import endpoints

PUBLISHED = {
    endpoints.key("flash-router", "default", 8000): "http://127.0.0.1:41001",
    endpoints.key("flash-prefill", "default", 30000): "http://127.0.0.1:41002",
    endpoints.pod_key("flash-decode-0", "default"): "http://127.0.0.1:41003",
}


class Published(Engines):
    """The runtime's map as the ConfigMap would hold it (no cluster here)."""

    def published(self) -> dict[str, str]:
        return PUBLISHED


def engines(tmp_path) -> Engines:
    return Published(LocalCluster(name="x", workdir=tmp_path))


def test_a_service_with_one_published_port_needs_no_port(tmp_path):
    assert engines(tmp_path).url("flash-router", "default", None) == "http://127.0.0.1:41001"
    assert engines(tmp_path).url("flash-prefill", "default", 30000) == "http://127.0.0.1:41002"


@pytest.mark.parametrize(
    ("service", "namespace", "port"),
    [("flash-router", "prod", None), ("flash-router", "default", 9), ("flash", "default", None)],
)
def test_an_unpublished_service_is_one_line_naming_what_answers(tmp_path, service, namespace, port):
    with pytest.raises(ClusterError) as err:
        engines(tmp_path).url(service, namespace, port)
    message = str(err.value)
    assert "\n" not in message and f"Service {service}.{namespace}" in message
    assert (
        "answering now: service/flash-prefill.default:30000, service/flash-router.default:8000"
        in message
    )


def test_status_lists_each_engine_and_its_url(capsys):
    _print_engines({"running": True, "pid": 7, "log": "/l", "endpoints": PUBLISHED})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "engines: local runtime running (pid 7), log /l"
    assert [line.split() for line in lines[1:]] == [
        ["pod/flash-decode-0.default", "http://127.0.0.1:41003"],
        ["service/flash-prefill.default:30000", "http://127.0.0.1:41002"],
        ["service/flash-router.default:8000", "http://127.0.0.1:41001"],
    ]


def test_status_says_how_to_start_engines_when_none_run(capsys):
    _print_engines({"running": False, "pid": None, "log": "/l", "endpoints": {}})
    assert "dsv4ctl cluster up --engines" in capsys.readouterr().out


def test_a_stale_pid_file_is_no_runtime(tmp_path):
    cluster = LocalCluster(name="x", workdir=tmp_path)
    folder = Engines(cluster).folder
    folder.mkdir(parents=True)
    (folder / "runtime.pid").write_text("1")  # init: alive, but not a local runtime
    assert Engines(cluster).pid() is None
    assert Engines(cluster).stop() is False
