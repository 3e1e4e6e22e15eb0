"""sglang-router 0.3.2, the real binary, as the probe and the engines meet it: what it sends
each worker of a PD pair, what it gives back, and which routes it serves.  Every fact the
probe relies on is asserted here, so a router that changes one fails this file first; the
field the probe used to rely on (``return_cached_tokens_details``, which the router drops)
is shown dropped, and the probe shown not to send it any more.  The workers are recording
stand-ins (an SGLang server needs a GPU); the router is the real one."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from dsv4_dev.cluster import pod_network
from dsv4_dev.localrun.runtime import router_command
from dsv4_engine.engine_metrics import labelled
from dsv4_engine.probe.probes import ProbeContext
from dsv4_engine.probe.settings import ProbeSettings
from dsv4_operator.api.rollout import Slot
from dsv4_operator.api.samples import load_sample
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.render.meta import Owner
from dsv4_operator.render.router import ROUTER_PORT, router_deployment
from tests.real_router import Worker, get, post, router, serving, wait_for

pytestmark = pytest.mark.slow

BOOTSTRAP = 8998


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(router URL, prefill worker, decode worker): the real router in PD mode in front of
    two recording workers, as `--prefill URL BOOTSTRAP_PORT --decode URL`."""
    prefill, decode = Worker("prefill"), Worker("decode")
    with serving(prefill, decode) as (p_url, d_url):
        args = ["--pd-disaggregation", "--prefill", p_url, str(BOOTSTRAP), "--decode", d_url]
        log = tmp_path_factory.mktemp("router") / "router.log"
        with router(args, log) as url:
            yield url, prefill, decode


def probe_body(**update) -> dict:
    """A chat request as the probe sends it (`ProbeContext.body`)."""
    ctx = ProbeContext(client=None, settings=ProbeSettings(base_url="http://x"), model="m")  # type: ignore[arg-type]
    body = ctx.body([{"role": "user", "content": "Call the tool."}], 64, tools=True)
    return {**body, **update}


def test_each_request_reaches_both_workers_with_the_bootstrap_room(pair):
    url, prefill, decode = pair
    status, raw = post(f"{url}/v1/chat/completions", probe_body())
    assert status == 200
    sent_p, sent_d = prefill.bodies[-1], decode.bodies[-1]
    assert sent_p == sent_d  # one body to both, at once
    assert sent_p["bootstrap_host"] == "127.0.0.1" and sent_p["bootstrap_port"] == BOOTSTRAP
    assert isinstance(sent_p["bootstrap_room"], int)
    # What the probe judges by survives: the tool, its choice, greedy decoding ...
    body = probe_body()
    assert sent_d["tools"] == body["tools"] and sent_d["tool_choice"] == "auto"
    assert sent_d["temperature"] == 0 and sent_d["messages"] == body["messages"]
    # ... the answer budget under another name, which both engines read ...
    assert "max_tokens" not in sent_d and sent_d["max_completion_tokens"] == 64
    # ... and the decode's answer comes back whole, its usage (the prompt's size) included.
    reply = json.loads(raw)
    assert reply["choices"][0]["message"]["content"] == "hello"
    assert reply["usage"]["prompt_tokens"] == 42


def test_the_field_the_probe_no_longer_sends_is_dropped(pair):
    """The router re-serialises the request from a typed struct: a field it does not know
    is gone.  So no answer through it can say what its prompt read from the host tier; the
    probe reads the engines' own counters instead, and does not ask."""
    url, _, decode = pair
    assert "return_cached_tokens_details" not in probe_body()
    post(f"{url}/v1/chat/completions", probe_body(return_cached_tokens_details=True))
    assert "return_cached_tokens_details" not in decode.bodies[-1]


def test_a_streamed_answer_keeps_its_usage_chunk(pair):
    """The probe asks a stream for its usage (`stream_options.include_usage`): the option
    reaches the decode, and its last chunk (no choices, the usage) reaches the client."""
    url, _, decode = pair
    body = probe_body(stream=True, stream_options={"include_usage": True})
    status, raw = post(f"{url}/v1/chat/completions", body)
    assert status == 200
    assert decode.bodies[-1]["stream_options"] == {"include_usage": True}
    chunks = [json.loads(line[6:]) for line in raw.decode().splitlines()
              if line.startswith("data: {")]  # fmt: skip
    assert chunks[-1] == {"choices": [], "usage": {"prompt_tokens": 42, "completion_tokens": 1,
                                                   "total_tokens": 43}}  # fmt: skip


def test_the_routes_the_probe_and_kubelet_ask(pair):
    """/v1/models lists the workers' served name; /server_info is not served (so the
    operator tells the probe what it would have read there: `canary_settings`); /health
    answers 200 whatever the workers do, /readiness says whether any can serve."""
    url, _, _ = pair
    status, raw = get(f"{url}/v1/models")
    assert status == 200 and json.loads(raw)["data"][0]["id"] == "deepseek-v4-flash"
    assert get(f"{url}/server_info")[0] == 404
    assert get(f"{url}/health")[0] == 200
    status, raw = get(f"{url}/readiness")
    assert status == 200 and json.loads(raw)["healthy_workers"] == 2


def test_engine_metrics_rewrites_names_and_labels_each_worker(pair):
    """Every worker's /metrics on one page, ``:`` spelled ``_``, each sample labelled with
    its worker; our imitation of it (`engine_metrics.labelled`, the reference router's)
    reads back alike."""
    url, prefill, decode = pair
    prefill.page = decode.page = (
        "# HELP dsv4:kv_canary_armed armed\n# TYPE dsv4:kv_canary_armed gauge\n"
        'dsv4:kv_canary_armed{engine_type="prefill"} 1.0\n'
    )
    status, raw = get(f"{url}/engine_metrics")
    assert status == 200
    lines = [line for line in raw.decode().splitlines() if line and not line.startswith("#")]
    workers = sorted(line.split('worker_addr="')[1].split('"')[0] for line in lines)
    assert len(lines) == 2 and all(line.startswith("dsv4_kv_canary_armed{") for line in lines)
    assert all(line.endswith("} 1") for line in lines)
    ours = labelled(prefill.page, workers[0])
    assert "dsv4_kv_canary_armed{" in ours and f'worker_addr="{workers[0]}"' in ours


def test_a_page_the_router_cannot_parse_is_left_out_silently(pair):
    """Why the probe requires its samples per worker (`kv_canary.unread`): one worker's page
    the router cannot parse (a counter family whose sample lacks `_total`) is dropped from
    /engine_metrics with no error, and the other worker's stays."""
    url, prefill, decode = pair
    prefill.page = "# TYPE sglang:weird counter\nsglang:weird 3\n"
    decode.page = "# TYPE sglang:fine_total counter\nsglang:fine_total 3\n"
    status, raw = get(f"{url}/engine_metrics")
    assert status == 200
    samples = [line for line in raw.decode().splitlines() if line and not line.startswith("#")]
    assert len(samples) == 1 and samples[0].startswith("sglang_fine_total{")


def test_the_rendered_router_command_starts_and_answers_health(tmp_path):
    """The router pod's container as the operator renders it (command, arguments, label
    discovery and all), run as the local runtime runs it (`router_command`: bound to a pod
    IP of a slot this test claims), answers /health.  With no API server to discover from
    it serves no worker: /readiness says so."""
    container = router_deployment(
        Owner("flash", "serving", "u"),
        DSV4DeploymentSpec.model_validate(load_sample()["spec"]),
        Slot.BLUE,
        "t",
    )["spec"]["template"]["spec"]["containers"][0]
    slot = pod_network.claim(tmp_path / "claims", tmp_path / "cluster")
    ip = pod_network.address(slot)
    argv = router_command(container["command"], container["args"], ip)
    env = {**os.environ, "KUBECONFIG": str(tmp_path / "no-such-kubeconfig")}
    with (tmp_path / "router.log").open("w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_for(f"http://{ip}:{ROUTER_PORT}/health")
        assert get(f"http://{ip}:{ROUTER_PORT}/readiness")[0] == 503
    finally:
        proc.terminate()
        proc.wait(10)
