"""SGLang 0.5.23's management endpoints on the engines the operator runs (issue 62, escape 4).

Without the plugin, SGLang's own HTTP app lets any caller that reaches an engine's port
update its weights, load a LoRA adapter, pause generation or release its memory: none of
that is canaried.  An admin key would not help: SGLang serves it back from /server_info to
the same callers.  With the plugin, loaded by SGLang's own launcher, every one of those calls
is refused 403 by SGLang's own auth middleware, and serving is untouched.  On SGLang's real
launcher module and app (no GPU: the launcher runs as far as its --help; the app answers
through starlette's TestClient)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.sglang  # with every SGLang test, on one worker (tests/conftest.py)

HARNESS = Path(__file__).with_name("admin_surface_harness.py")
# What the review named (weight updates, LoRA, pause, memory release), and the cache flush
# sglang-router 0.3.2 fans out to every worker from its own /flush_cache.
MANAGEMENT = (
    "/update_weights_from_disk",
    "/update_weights_from_tensor",
    "/update_weights_from_distributed",
    "/load_lora_adapter",
    "/pause_generation",
    "/release_memory_occupation",
    "/flush_cache",
)
SERVING = "/v1/chat/completions"
ADMIN_OPTIONAL_ROUTES = 42  # in SGLang 0.5.23's http_server.py
AUTH_REFUSALS = (401, 403)


@pytest.fixture
def launched(
    fresh_process: Callable[..., subprocess.CompletedProcess[str]],
) -> Callable[[str], dict[str, Any]]:
    """The harness's result with ``SGLANG_PLUGINS`` set as given."""

    def run(plugins: str) -> dict[str, Any]:
        env = {**os.environ, "SGLANG_PLUGINS": plugins}
        proc = fresh_process(HARNESS, *MANAGEMENT, SERVING, "/server_info", env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        return json.loads(line.removeprefix("RESULT "))

    return run


def test_without_the_plugin_sglang_serves_its_management_endpoints_to_any_caller(launched):
    found = launched("none")
    assert found["counts"]["admin_optional"] == ADMIN_OPTIONAL_ROUTES
    assert found["counts"]["admin_force"] == 0
    assert {found["levels"][p] for p in MANAGEMENT} == {"admin_optional"}
    assert found["middleware"] is False
    for path in MANAGEMENT:  # past any auth, into SGLang's handler (which checks the body)
        assert not set(found["answers"][path]) & set(AUTH_REFUSALS), path


def test_with_the_plugin_every_management_call_is_refused_and_serving_is_not(launched):
    found = launched("dsv4_index_k")
    assert found["counts"]["admin_optional"] == 0
    assert found["counts"]["admin_force"] == ADMIN_OPTIONAL_ROUTES
    assert {found["levels"][p] for p in MANAGEMENT} == {"admin_force"}
    assert found["middleware"] is True
    assert {path: found["answers"][path] for path in MANAGEMENT} == {
        path: [403, 403] for path in MANAGEMENT
    }
    assert not set(found["answers"][SERVING]) & set(AUTH_REFUSALS)
    assert found["levels"][SERVING] == found["levels"]["/server_info"] == "normal"


def test_an_admin_key_would_be_served_to_whoever_reads_server_info():
    """Why the operator sets no --admin-api-key (and refuses one in extraArgs): SGLang
    returns it from /server_info, an endpoint open without --api-key."""
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.utils.auth import AuthLevel, decide_request_auth
    from sglang.srt.utils.common import build_server_info

    args = ServerArgs(model_path="/models/deepseek-v4-flash", admin_api_key="s3cret")
    assert build_server_info(args, {})["admin_api_key"] == "s3cret"
    open_to_all = decide_request_auth(
        method="GET",
        path="/server_info",
        authorization_header=None,
        api_key=None,
        admin_api_key="s3cret",
        auth_level=AuthLevel.NORMAL,
    )
    assert open_to_all.allowed
