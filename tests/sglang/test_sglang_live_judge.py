"""On SGLang 0.5.23's real chat serving classes, with the plugin loaded by SGLang's own
``load_plugins()``: every tool-call answer served with ``--tool-call-parser deepseekv4``,
streamed and not, is judged and counted on the engine's /metrics page by outcome — VALID,
a corruption class, DSML the parser left in ``content``, TRUNCATED — and a PD prefill
server judges nothing (live_judge_harness.py says what is real there)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dsv4_engine import live_judge
from dsv4_engine.probe.dsml_format import DsmlFormat, render_dsml
from dsv4_engine.sglang_plugin import live_judge as plugin_judge
from tests.unit.engine.weather_request import MESSAGES, TOOLS

pytestmark = pytest.mark.sglang  # with every SGLang test, on one worker (tests/conftest.py)

HARNESS = Path(__file__).with_name("live_judge_harness.py")
HOOKS_HARNESS = Path(__file__).with_name("plugin_hooks_harness.py")
BLOCK = render_dsml(DsmlFormat.V4, "get_weather", {"city": "Paris"})
# What each raw model text is served as, and judged.
CASES = {
    "VALID": ("Sure." + BLOCK, "stop"),
    "SCHEMA": ("Sure." + render_dsml(DsmlFormat.V4, "get_weather", {"town": "Paris"}), "stop"),
    "DEGENERATE_TEXT": ("The weather is nice today. " * 30, "stop"),
    # A block whose tags the model spaced: SGLang's parser leaves it all in content.
    "DSML_IN_CONTENT": ("Sure." + BLOCK.replace("<｜DSML｜", "< ｜DSML｜"), "stop"),
    "TRUNCATED": ("Sure." + BLOCK[:70], "length"),
}


def run_harness(fresh_process, model_dir: str, mode: str, cases: list[dict]):
    env = {**os.environ, "SGLANG_PLUGINS": "dsv4_index_k", "DSV4_REVISION": "rev-a"}
    proc = fresh_process(HARNESS, model_dir, mode, input=json.dumps(cases), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    served = {}
    page = []
    for line in proc.stdout.splitlines():
        if line.startswith("SERVED "):
            item = json.loads(line.removeprefix("SERVED "))
            served[item.pop("id")] = item
        elif line.startswith("JUDGE "):
            role = json.loads(line.removeprefix("JUDGE "))
        else:
            page.append(line)
    return served, role, "\n".join(page) + "\n"


@pytest.fixture(scope="module")
def decode_engine(fresh_process, model_dirs):
    request = {"messages": MESSAGES, "tools": TOOLS}
    cases = [
        {"id": f"{name}/{stream}", "text": text, "finish": finish, "stream": stream, **request}
        for name, (text, finish) in CASES.items()
        for stream in (False, True)
    ]
    cases += [{"id": "no tools", "text": "Sure." + BLOCK, "finish": "stop", "stream": False,
               "messages": MESSAGES}]  # fmt: skip
    return run_harness(fresh_process, model_dirs["flash"], "decode", cases)


def counts(page: str) -> dict[str, float]:
    families = {f.name: f for f in text_string_to_metric_families(page)}
    family = families[live_judge.METRIC.removesuffix("_total")]
    out = {}
    for sample in family.samples:
        if sample.name == live_judge.METRIC:
            assert sample.labels["revision"] == "rev-a" and sample.labels["role"] == "decode"
            out[sample.labels["outcome"]] = sample.value
    return out


def test_each_outcome_is_counted_streamed_and_not(decode_engine):
    served, role, page = decode_engine
    assert role == "decode"
    expected = dict.fromkeys(live_judge.OUTCOMES, 0.0)
    expected |= {name: 2.0 for name in CASES}  # each once streamed, once not
    assert counts(page) == expected, "every outcome exported, the answer without tools not"
    families = {f.name: f for f in text_string_to_metric_families(page)}
    lengths = families[live_judge.TOKENS_METRIC]
    (count,) = [s.value for s in lengths.samples if s.name.endswith("_count")]
    assert count == 2 * len(CASES)


def test_what_the_client_got_is_what_was_judged(decode_engine):
    served, _, _ = decode_engine
    for stream in (False, True):
        valid = served[f"VALID/{stream}"]
        assert valid["finish_reason"] == "tool_calls"
        (call,) = valid["message"]["tool_calls"]
        assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
        left = served[f"DSML_IN_CONTENT/{stream}"]
        assert "｜DSML｜" in left["message"]["content"] and not left["message"].get("tool_calls")
        assert served[f"TRUNCATED/{stream}"]["finish_reason"] == "length"
    assert served["VALID/False"]["message"]["content"] == "Sure."
    assert served["VALID/True"]["message"]["content"] == "Sure."


def test_a_pd_prefill_server_judges_nothing(fresh_process, model_dirs):
    """Its answers carry no generated text (SGLang prefills with max_new_tokens 1); the
    router gives the user the decode server's answer."""
    cases = [{"id": "VALID", "text": "Sure." + BLOCK, "finish": "stop", "stream": False,
               "messages": MESSAGES, "tools": TOOLS}]  # fmt: skip
    served, role, page = run_harness(fresh_process, model_dirs["flash"], "prefill", cases)
    assert role is None and served["VALID"]["finish_reason"] == "tool_calls"
    assert live_judge.METRIC.removesuffix("_total") not in page


@pytest.mark.parametrize(
    ("target", "hook"),
    [
        (plugin_judge.RESPONSE_TARGET, "judge_response"),
        (plugin_judge.STREAM_TARGET, "judge_stream"),
    ],
)
def test_a_live_judge_hook_sglang_cannot_apply_stops_the_engine(
    fresh_process: Callable[..., subprocess.CompletedProcess[str]], target, hook
):
    env = {**os.environ, "SGLANG_PLUGINS": "dsv4_index_k"}
    proc = fresh_process(HOOKS_HARNESS, "--rename", target, env=env)
    assert proc.returncode == 1
    assert "RESULT" not in proc.stdout
    method = target.rpartition(".")[2]
    assert (
        f"dsv4_index_k: SGLang cannot apply hook {hook} to {target} (AttributeError: type "
        f"object 'OpenAIServingChat' has no attribute '{method}'). The plugin is written for "
        "SGLang 0.5.23; this is SGLang 0.5.23. Without the hook"
    ) in proc.stderr
    assert "tool-call answers would go unjudged and uncounted: refusing to start." in proc.stderr
