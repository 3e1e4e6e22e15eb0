"""The probe client against ScriptedCompletionServer, a loopback stand-in for an LLM (which
cannot run here) with a seeded, configurable corruption rate: concurrency achieved,
failed requests counted as failures (never re-issued) after a warm-up that waits for the
engine, sequential FAIL speed, PASS only with enough evidence, and inapplicable checks
reported rather than counted."""

import json
import random

import jsonschema
import pytest
import pytest_asyncio
from aiohttp import web

from dsv4_engine.pools.layout import INDEXED_RATIO
from dsv4_engine.probe import (
    Backend,
    Outcome,
    ProbeConnectionError,
    ProbeName,
    ProbeSettings,
    Verdict,
    build_report,
    report_schema,
    run_probes,
)
from dsv4_engine.probe.dsml import DsmlFormat
from dsv4_engine.probe.dsml_format import render_dsml
from dsv4_engine.probe.evidence import proven_exercised
from dsv4_engine.probe.report import summary_table
from dsv4_engine.probe.scripted_server import ScriptedCompletionServer
from dsv4_engine.probe.settings import DEFAULT_PROBES, ECHO_MODEL_PROBES
from dsv4_engine.probe.validate import classify_completion
from dsv4_engine.probe.workload import ECHO_TOOL_NAME, document, random_echo
from dsv4_engine.reference import tokenizer
from dsv4_engine.reference.model import REFERENCE_SHAPE, ModelConfig


@pytest_asyncio.fixture
async def serve():
    servers = []

    async def start(**kwargs) -> tuple[ScriptedCompletionServer, str]:
        server = ScriptedCompletionServer(**kwargs)
        servers.append(server)
        return server, await server.start()

    yield start
    for server in servers:
        await server.stop()


def _settings(url: str, **kwargs) -> ProbeSettings:
    defaults = {"probes": (ProbeName.TOOLCALL_ECHO,), "concurrency": 16, "request_timeout_s": 10}
    return ProbeSettings(base_url=url, **{**defaults, **kwargs})


@pytest.mark.asyncio
@pytest.mark.parametrize("fmt", list(DsmlFormat))
async def test_clean_engine_passes_with_exact_bound(serve, fmt):
    server, url = await serve(fmt=fmt)
    result = await run_probes(_settings(url, format=fmt, requests=600))
    assert result.verdict is Verdict.PASS, result.reasons
    assert result.judged == 600 and result.corrupt == 0
    assert result.upper_bound < 0.005
    assert server.chat_requests == 1 + 600  # the warm-up, then the samples


@pytest.mark.asyncio
async def test_twelve_percent_corruption_fails_within_tens_of_samples(serve):
    _, url = await serve(corruption_rate=0.12, seed=3)
    result = await run_probes(_settings(url, requests=2000))
    assert result.verdict is Verdict.FAIL
    assert result.tally.fail_at is not None and result.tally.fail_at <= 100
    assert len(result.tally.samples) < 200, "stops soon after FAIL, does not run the budget"
    report = build_report(result)
    assert report["counts"]["ARG_CORRUPTION"] == result.corrupt > 0
    assert 0.02 < report["rate"] < 0.4
    assert report["examples"]["ARG_CORRUPTION"][0]["detail"].startswith("echoed")


@pytest.mark.asyncio
async def test_corruption_is_found_in_server_parsed_tool_calls_too(serve):
    _, url = await serve(corruption_rate=0.12, parsed_tool_calls=True, seed=5)
    result = await run_probes(_settings(url, requests=2000))
    assert result.verdict is Verdict.FAIL
    assert {s.outcome for s in result.tally.samples} == {Outcome.VALID, Outcome.ARG_CORRUPTION}


@pytest.mark.asyncio
async def test_achieved_concurrency_is_measured(serve):
    server, url = await serve(latency_s=0.2)  # long enough to have all 32 sent under load
    result = await run_probes(_settings(url, concurrency=32, requests=128))
    assert server.max_in_flight == 32
    assert result.peak_concurrency == 32
    assert 16 < result.mean_concurrency <= 32
    # 128 samples cannot bound a 0.5% rate: never PASS by default.
    assert result.verdict is Verdict.INCONCLUSIVE


@pytest.mark.asyncio
async def test_unreached_concurrency_is_inconclusive(serve):
    _, url = await serve()
    result = await run_probes(_settings(url, concurrency=64, requests=20, max_corruption_rate=0.9))
    assert result.peak_concurrency <= 20
    assert result.verdict is Verdict.INCONCLUSIVE
    assert any("target 64" in r for r in result.reasons)


@pytest.mark.asyncio
async def test_failed_requests_count_as_failures_and_are_not_reissued(serve):
    """11 requests answered HTTP 500 beside 598 clean samples: without the 11, 598 clean
    samples PASS at the defaults; with them the bound is on 11/609 and nothing PASSes."""
    failing = frozenset(range(50, 610, 55))  # 11 chat requests by arrival; 1: the warm-up
    server, url = await serve(failing_requests=failing)
    result = await run_probes(_settings(url, requests=598 + 11))
    assert server.chat_requests == 1 + 609, "no failed request's slot was given back"
    assert result.judged == 609 and result.corrupt == 0 and result.failed == 11
    assert result.verdict is not Verdict.PASS
    assert result.verdict is Verdict.INCONCLUSIVE, result.reasons
    assert any(
        "11/609 failed: 0 corrupt, 11 requests without an answer" in r for r in result.reasons
    )
    errors = [s for s in result.tally.samples if s.outcome is Outcome.TRANSPORT_ERROR]
    assert len(errors) == 11 and "HTTP 500" in errors[0].detail
    report = build_report(result)
    assert report["samples"]["transport_errors"] == report["samples"]["failed"] == 11
    assert report["counts"]["TRANSPORT_ERROR"] == 11
    rows = summary_table(report).splitlines()
    assert any(
        r.startswith("failed requests") and r.endswith(" 11 (no answer to judge; each a failure)")
        for r in rows
    )


@pytest.mark.asyncio
async def test_a_canary_failing_its_requests_fails_like_a_corrupting_one(serve):
    _, url = await serve(transport_error_rate=0.2, seed=1)
    result = await run_probes(_settings(url, requests=600))
    assert result.corrupt == 0 and result.verdict is Verdict.FAIL
    assert result.tally.fail_at is not None and result.tally.fail_at <= 100
    assert "requests without an answer" in result.reasons[0]


@pytest.mark.asyncio
async def test_the_warm_up_waits_for_an_engine_that_is_not_answering_yet(serve):
    """Failures before the first answer mean "not ready": retried, never judged."""
    server, url = await serve(failing_requests=frozenset({1, 2, 3}))
    result = await run_probes(_settings(url, requests=600))
    assert server.chat_requests == 3 + 1 + 600
    assert result.failed == 0 and result.verdict is Verdict.PASS, result.reasons


@pytest.mark.asyncio
async def test_an_engine_that_never_answers_the_warm_up_gives_no_evidence(serve):
    server, url = await serve(transport_error_rate=1.0)
    with pytest.raises(ProbeConnectionError, match="did not answer a warm-up request within 1 s"):
        await run_probes(_settings(url, warm_up_s=1))
    assert 2 <= server.chat_requests <= 3  # tried again after 0.5 s, then 1 s


@pytest.mark.asyncio
async def test_unreachable_engine_is_a_connection_error(unused_tcp_port):
    with pytest.raises(ProbeConnectionError, match="did not answer a warm-up request"):
        await run_probes(
            _settings(f"http://127.0.0.1:{unused_tcp_port}", connect_timeout_s=2, warm_up_s=1)
        )


@pytest.mark.asyncio
async def test_reference_backend_consistency_catches_changed_warm_answers(serve):
    server, url = await serve(corruption_rate=0.12, seed=2)
    settings = ProbeSettings(
        base_url=url,
        backend=Backend.REFERENCE,
        concurrency=8,
        requests=1000,
        prefix_words=64,
        long_context_words=256,
        admin_offload_path="default",  # the reference engine's test knob, asked for
    )
    result = await run_probes(settings)
    assert result.applicable == settings.probe_set()
    assert result.verdict is Verdict.FAIL
    assert result.tally.fail_at <= 100
    assert server.offloads >= result.judged  # one offload between every cold and warm answer
    assert {s.outcome for s in result.tally.samples} <= {Outcome.VALID, Outcome.CACHE_MISMATCH}


@pytest.mark.asyncio
async def test_consistency_on_a_nondeterministic_engine_is_not_applicable(serve):
    server, url = await serve(deterministic=False)
    settings = ProbeSettings(base_url=url, backend=Backend.REFERENCE, requests=50)
    result = await run_probes(settings)
    assert result.verdict is Verdict.INCONCLUSIVE
    assert set(result.not_applicable) == set(settings.probe_set())
    assert "not deterministic" in next(iter(result.not_applicable.values()))
    assert result.judged == 0 and server.chat_requests == 1  # the warm-up only


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("info", "applies"),
    [
        ({"exec": {"deterministic": {"enable_deterministic_inference": True}}}, True),
        ({"enable_deterministic_inference": True, "tp_size": 8}, True),
        ({"exec": {"deterministic": {"enable_deterministic_inference": False}}}, False),
        ({"version": "0.5.23"}, False),
    ],
)
async def test_sglang_determinism_is_read_from_server_info(serve, info, applies):
    _, url = await serve(server_info=info)
    settings = _settings(url, probes=(ProbeName.CACHE_CONSISTENCY,), concurrency=2, requests=4)
    result = await run_probes(settings)
    assert (result.applicable == (ProbeName.CACHE_CONSISTENCY,)) is applies
    assert (result.judged == 4) is applies


@pytest.mark.asyncio
async def test_missing_offload_endpoint_makes_consistency_not_applicable_only(serve):
    _, url = await serve(offload_endpoint=False)
    probes = (ProbeName.TOOLCALL_ECHO, ProbeName.CACHE_CONSISTENCY)
    settings = ProbeSettings(
        base_url=url, backend=Backend.REFERENCE, probes=probes, concurrency=4, requests=40,
        admin_offload_path="default",
    )  # fmt: skip
    result = await run_probes(settings)
    assert result.not_applicable == {
        ProbeName.CACHE_CONSISTENCY: "engine has no POST /admin/hicache/offload (host-tier offload)"
    }
    assert result.applicable == (ProbeName.TOOLCALL_ECHO,)
    assert result.judged == 40 and result.corrupt == 0


@pytest.mark.asyncio
async def test_report_follows_its_schema(serve):
    _, url = await serve(corruption_rate=0.05, seed=9)
    probes = (
        ProbeName.TOOLCALL_ECHO,
        ProbeName.TOOLCALL_ECHO_PREFIX_REUSE,
        ProbeName.TOOLCALL_ECHO_LONG_CONTEXT,
        ProbeName.CACHE_CONSISTENCY_PREFIX_REUSE,
    )
    settings = _settings(url, probes=probes, requests=200, prefix_words=64, long_context_words=200)
    report = build_report(await run_probes(settings))
    jsonschema.Draft202012Validator(report_schema()).validate(report)
    assert set(report["probes"]["applicable"]) == {p.value for p in probes}
    assert report["concurrency"]["peak"] == 16
    assert report["latency"]["count"] == report["samples"]["judged"]
    assert report["series"][-1]["n"] == report["samples"]["judged"]


@pytest.mark.asyncio
async def test_time_limit_stops_the_run_inconclusive(serve):
    _, url = await serve(latency_s=0.02)
    result = await run_probes(_settings(url, concurrency=4, requests=10_000, max_duration_s=0.5))
    assert result.tally.stopped_because == "time limit of 0.5 s reached"
    assert 0 < len(result.tally.samples) < 200
    assert result.verdict is Verdict.INCONCLUSIVE


def test_long_context_prompts_exceed_the_indexer_selection_and_fit_the_engine():
    """A prompt exercises the indexer only when it holds more compressed entries than the
    indexer selects.  SGLang serves V4-Flash (top 512 of entries compressed 4:1; a filler
    word is at least one token).  The reference engine's model selects top index_topk of
    entries compressed 4:1, tokenizes bytes and serves 16384 tokens of context."""
    sglang = ProbeSettings(base_url="http://x", backend=Backend.SGLANG)
    assert sglang.long_prompt_words > 512 * 4
    reference = ProbeSettings(base_url="http://x", backend=Backend.REFERENCE)
    prompt = document(random.Random(0), reference.long_prompt_words, "L0")
    selected = ModelConfig().index_topk * INDEXED_RATIO
    assert 10 * selected < len(prompt.encode()) < 16384 - 1024
    for words, tag in (
        (reference.shared_prefix_words, "P0"),
        (reference.single_prompt_words, "S0"),
    ):
        prompt = document(random.Random(0), words, tag)
        assert len(prompt.encode()) > 3 * REFERENCE_SHAPE.page_size  # full pages to load back


@pytest.mark.asyncio
async def test_engine_without_a_model_list_is_probed_with_the_given_model(serve):
    server, url = await serve(models_endpoint=False)
    result = await run_probes(_settings(url, model="dsv4-reference", concurrency=2, requests=6))
    assert result.model == "dsv4-reference" and result.judged == 6


@pytest_asyncio.fixture
async def aiohttp_reply_server():
    """A loopback server whose chat endpoint answers the warm-up, then always returns one
    fixed (malformed) reply."""
    runners = []

    async def start(reply) -> str:
        served = []

        async def models(_: web.Request) -> web.Response:
            return web.json_response({"data": [{"id": "m"}]})

        async def chat(_: web.Request) -> web.Response:
            served.append(reply)
            if len(served) == 1:
                return web.json_response({"choices": [{"message": {"content": "OK"}}]})
            return web.json_response(reply)

        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield start
    for runner in runners:
        await runner.cleanup()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "reply",
    [
        {"choices": []},
        {"choices": [{"message": {"content": ["a list"]}}]},
        {"choices": [{"message": {"content": "", "tool_calls": "call"}}]},
        "not an object",
    ],
)
async def test_malformed_replies_are_failed_requests_not_crashes(reply, aiohttp_reply_server):
    url = await aiohttp_reply_server(reply)
    result = await run_probes(_settings(url, concurrency=2, requests=12))
    # Every malformed answer is a failed request, counted, not re-issued: the FAIL rule
    # fires at its first look (10 judged samples).
    assert result.tally.fail_at == 10 and result.tally.transport_errors == result.judged
    assert result.tally.stopped_because == "sequential FAIL rule fired"
    assert result.verdict is Verdict.FAIL


@pytest.mark.asyncio
async def test_the_probe_judges_an_answer_relative_to_its_request(unused_tcp_port):
    """The echo prompt is ASCII: prose in two scripts it does not hold is token salad —
    which the judge can only tell because the probe hands it the request."""
    prose = "Готово: καιρός."

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        if not body.get("tools"):  # the warm-up
            return web.json_response({"choices": [{"message": {"content": "OK"}}]})
        instruction = body["messages"][-1]["content"]
        args, _ = json.JSONDecoder().raw_decode(instruction[instruction.index("{") :])
        content = prose + render_dsml(DsmlFormat.V4, ECHO_TOOL_NAME, args)
        choice = {"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        return web.json_response({"choices": [choice]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", unused_tcp_port).start()
    try:
        url = f"http://127.0.0.1:{unused_tcp_port}"
        # This stand-in answers whole: no sample streams (streaming is tested on its own).
        result = await run_probes(_settings(url, requests=8, concurrency=4, stream_share=0.0))
    finally:
        await runner.cleanup()
    details = {s.detail for s in result.tally.samples}
    assert {s.outcome for s in result.tally.samples} == {Outcome.DEGENERATE_TEXT}, details
    assert all("token salad" in d for d in details)
    echo = random_echo(random.Random(0))
    alone = prose + render_dsml(DsmlFormat.V4, echo.tool, echo.args)
    assert classify_completion(alone, DsmlFormat.V4).valid  # without the request: could be quoting


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("echo", ECHO_MODEL_PROBES),
        ("random", DEFAULT_PROBES[Backend.REFERENCE]),
        (None, DEFAULT_PROBES[Backend.REFERENCE]),
    ],
)
async def test_the_reference_engines_model_picks_the_default_probe_set(serve, model, expected):
    """The echo model follows the echo prompt: by default it gets the probe set a real model
    gets, tool-call echo included; the random model (or an engine that does not say) gets
    consistency only."""
    info = {"deterministic": True} | ({"reference_model": model} if model else {})
    _, url = await serve(server_info=info)
    settings = ProbeSettings(base_url=url, backend=Backend.REFERENCE, concurrency=8, requests=16)
    result = await run_probes(settings)
    assert result.applicable == expected and result.judged == 16
    assert ECHO_MODEL_PROBES == DEFAULT_PROBES[Backend.SGLANG]


@pytest.mark.asyncio
async def test_echo_requests_make_a_host_round_trip_only_when_the_knob_asks(serve):
    """Asked for the reference engine's host-tier offload (a test knob), each echo request is
    preceded by a one-token answer to the same prompt and an offload, so it is answered
    while its prefix loads back; by default (SGLang has no such call, and a canary reaches
    the host tier by eviction) the echo requests go out alone, on either backend."""
    knob, url = await serve()
    settings = _settings(url, backend=Backend.REFERENCE, concurrency=4, requests=12)
    await run_probes(settings.model_copy(update={"admin_offload_path": "default"}))
    assert knob.chat_requests == 1 + 2 * 12  # the warm-up, then two per sample
    assert knob.offloads == 1 + 12  # the preflight's, then one per sample
    for backend in Backend:
        plain, url = await serve()
        await run_probes(_settings(url, backend=backend, concurrency=4, requests=12))
        assert (plain.chat_requests, plain.offloads) == (1 + 12, 0)


@pytest.mark.asyncio
async def test_each_example_shows_the_clean_answer_beside_the_damaged_one(serve):
    """An echo example carries the call the prompt asked for; a consistency example, the
    cold answer the warm one should have repeated."""
    _, url = await serve(corruption_rate=0.3, seed=4)
    probes = (ProbeName.TOOLCALL_ECHO, ProbeName.CACHE_CONSISTENCY)
    settings = ProbeSettings(
        base_url=url, backend=Backend.REFERENCE, probes=probes, concurrency=8, requests=60,
        max_corruption_rate=0.9,
    )  # fmt: skip
    report = build_report(await run_probes(settings))
    jsonschema.Draft202012Validator(report_schema()).validate(report)
    for example in report["examples"]["ARG_CORRUPTION"]:
        echo = random_echo(random.Random(f"{settings.seed}:{example['sample']}"))
        assert example["expected"] == render_dsml(DsmlFormat.V4, echo.tool, echo.args)
        assert example["excerpt"] != example["expected"]
    for example in report["examples"]["CACHE_MISMATCH"]:
        assert example["excerpt"] == example["expected"][::-1]  # the scripted warm damage
    summary = summary_table(report).splitlines()
    shown = [i for i, line in enumerate(summary) if line.startswith("example ")]
    assert len(shown) == 3  # a few: each class once before any shows twice
    assert {summary[i].split()[1] for i in shown[:2]} == {"ARG_CORRUPTION", "CACHE_MISMATCH"}
    for i in shown:
        assert summary[i + 1].startswith("  expected  ") and summary[i + 2].startswith(
            "  answered  "
        )


def test_an_echo_answer_budget_per_backend():
    """A tool call is ~100 DeepSeek tokens and ~110 of the reference engine's (its markup in
    pieces): the reference default holds the longest echo call the probes ask for twice
    over, so a clean answer is never cut; an explicit max_tokens wins."""
    rng = random.Random(0)
    longest = max(
        len(tokenizer.encode_output(render_dsml(DsmlFormat.V4, echo.tool, echo.args)))
        for echo in (random_echo(rng) for _ in range(200))
    )
    assert 2 * longest <= ProbeSettings(base_url="http://x", backend=Backend.REFERENCE).echo_tokens
    assert ProbeSettings(base_url="http://x").echo_tokens == 256
    assert ProbeSettings(base_url="http://x", max_tokens=64).echo_tokens == 64


@pytest.mark.asyncio
async def test_a_hicache_run_counts_the_answers_that_read_back_from_the_host_tier(serve):
    """The engines' page counts the host-tier tokens their prefix matches read: here every
    consistency sample's warm request finds its prompt evicted to the host tier (a device
    of one slot); the judged answers proven to account for them
    (`evidence.proven_exercised`) carry the HiCache PASS — shown as exercised / judged /
    clean.  Cold and warm prompts are the same size, so the bound proves half the answers:
    never more than read."""
    server, url = await serve(device_slots=0)
    settings = _settings(
        url, backend=Backend.REFERENCE, probes=(ProbeName.CACHE_CONSISTENCY,), hicache=True,
        requests=600,
    )  # fmt: skip
    result = await run_probes(settings)
    assert result.verdict is Verdict.PASS, result.reasons
    tally = result.tally
    proven = proven_exercised(server.host_tokens, tally.judged_prompts, tally.unjudged_tokens)
    assert tally.exercised == proven and 24 <= proven <= len(tally.judged_prompts) == 1200
    assert result.host_tier.host_tokens == server.host_tokens > 0
    report = build_report(result)
    jsonschema.Draft202012Validator(report_schema()).validate(report)
    exercised = report["samples"]["exercised"]
    assert exercised == result.tally.exercised and report["settings"]["hicache"] is True
    rows = summary_table(report).splitlines()
    assert f"exercised/judged/clean  {exercised} / 600 / 600" in rows
    older = {**report, "samples": {k: v for k, v in report["samples"].items() if k != "exercised"}}
    assert "exercised/judged/clean  - / 600 / 600" in summary_table(older).splitlines()
    assert any(
        r.startswith("host-tier reads") and "24 exercised answers required" in r for r in rows
    )


@pytest.mark.asyncio
async def test_with_the_offload_knob_the_priming_requests_prove_nothing(serve):
    """The reference-only knob answers a priming request before each judged one: that
    request is not judged and may have read everything the engines counted, so a HiCache
    run on the knob cannot PASS on the engines' count (it FAILs on corruption all the same)."""
    _, url = await serve()
    knob = _settings(
        url, backend=Backend.REFERENCE, hicache=True, requests=600, admin_offload_path="default"
    )
    result = await run_probes(knob)
    assert result.tally.exercised == 0 and result.verdict is Verdict.INCONCLUSIVE
    assert result.host_tier.host_tokens > 0


@pytest.mark.asyncio
async def test_a_hicache_run_whose_samples_never_read_the_host_tier_is_inconclusive(serve):
    """Nothing evicted, no knob: the engines count no host-tier read, and 600 clean samples
    do not PASS a HiCache canary.  Without HiCache the same run PASSes and the count is not
    asked for."""
    _, url = await serve()
    unexercised = _settings(url, backend=Backend.REFERENCE, requests=600)
    result = await run_probes(unexercised.model_copy(update={"hicache": True}))
    assert result.corrupt == 0 and result.tally.exercised == 0
    assert result.verdict is Verdict.INCONCLUSIVE
    assert result.reasons == (
        "HiCache is on but only 0 judged answers are proven to have read "
        "a prefix back from the host tier; at least 24 required",
    )
    result = await run_probes(unexercised)
    assert result.verdict is Verdict.PASS, result.reasons
    rows = summary_table(build_report(result)).splitlines()
    assert any(r.startswith("host-tier reads") and "not applicable: HiCache off" in r for r in rows)


@pytest.mark.asyncio
async def test_host_tier_reads_that_cannot_be_read_leave_a_hicache_run_inconclusive(serve):
    """A HiCache run whose engines' page cannot be read proves no host-tier read, however
    its answers look."""
    _, url = await serve(engine_metrics_endpoint=False)
    settings = _settings(url, requests=600, hicache=True, admin_offload_path="default")
    result = await run_probes(settings)
    assert result.verdict is Verdict.INCONCLUSIVE
    assert result.reasons[0] == "host-tier reads not read: GET /metrics: HTTP 404"


@pytest.mark.asyncio
async def test_a_fail_needs_no_exercised_samples(serve):
    """The count gates a PASS only: corruption seen is a FAIL however it was reached."""
    _, url = await serve(corruption_rate=0.12, seed=3)
    settings = _settings(url, hicache=True, requests=2000)
    result = await run_probes(settings)
    assert result.verdict is Verdict.FAIL and result.tally.exercised == 0


@pytest.mark.asyncio
@pytest.mark.parametrize("parsed", [False, True], ids=["raw DSML", "server-parsed tool_calls"])
async def test_a_share_of_samples_streams_and_streamed_corruption_is_caught(serve, parsed):
    """A quarter of the tool-call samples stream by default: their calls are joined from the
    deltas and judged like the rest, corrupt ones included; the report says how many."""
    server, url = await serve(corruption_rate=0.3, seed=9, parsed_tool_calls=parsed)
    result = await run_probes(_settings(url, requests=200, max_corruption_rate=0.9))
    streamed = [s for s in result.tally.samples if s.streamed]
    assert result.tally.streamed == len(streamed)
    assert 0.15 * result.judged < len(streamed) < 0.35 * result.judged
    assert any(s.outcome.is_corruption for s in streamed), "damage found in streamed calls"
    assert any(s.outcome is Outcome.VALID for s in streamed)
    report = build_report(result)
    assert report["samples"]["streamed"] == len(streamed)
    row = next(r for r in summary_table(report).splitlines() if r.startswith("streamed/whole"))
    assert row.endswith(f"{len(streamed)} / {result.judged - len(streamed)}")
    whole = await run_probes(_settings(url, requests=50, stream_share=0.0, seed=1))
    assert whole.tally.streamed == 0


@pytest.mark.asyncio
async def test_a_kv_canary_violation_during_the_run_fails_it_and_is_named(serve):
    """Every answer is clean; the engine's own kv-canary counted one violation while the
    samples ran (read through GET /engine_metrics before and after): FAIL, naming it."""
    _, url = await serve(kv_canary_violation_at=10)
    result = await run_probes(_settings(url, requests=600, kv_canary=True))
    assert result.corrupt == 0 and result.tally.fail_at is None
    assert result.verdict is Verdict.FAIL
    (reason,) = result.reasons
    assert reason == (
        "kv-canary violations during the run: 1 x launch_tag=HEAD_K_FULL "
        "fail_reason=verify_chain_hash on scripted"
    )
    report = build_report(result)
    jsonschema.Draft202012Validator(report_schema()).validate(report)
    assert report["kv_canary"] == {
        "violations": [
            {
                "worker": "scripted",
                "launch_tag": "HEAD_K_FULL",
                "fail_reason": "verify_chain_hash",
                "count": 1,
            }
        ],
        "unread": None,
    }
    (row,) = [line for line in summary_table(report).splitlines() if line.startswith("kv-canary ")]
    assert row.split(maxsplit=1)[1] == "1 violations during the run (each FAILs it)"


@pytest.mark.asyncio
@pytest.mark.parametrize("kv_canary", [True, False])
async def test_no_kv_canary_violation_changes_nothing(serve, kv_canary):
    """A violation counted before the run (at the warm-up) is not the run's; a probe not
    asked to read kv-canary never reads it."""
    _, url = await serve(kv_canary_violation_at=1)
    result = await run_probes(_settings(url, requests=600, kv_canary=kv_canary))
    assert result.verdict is Verdict.PASS, result.reasons
    report = build_report(result)
    jsonschema.Draft202012Validator(report_schema()).validate(report)
    assert report["kv_canary"] == ({"violations": [], "unread": None} if kv_canary else None)


@pytest.mark.asyncio
async def test_kv_canary_violations_that_cannot_be_read_leave_the_run_inconclusive(serve):
    _, url = await serve(engine_metrics_endpoint=False)
    result = await run_probes(_settings(url, requests=600, kv_canary=True))
    assert result.verdict is Verdict.INCONCLUSIVE
    assert result.reasons == ("kv-canary violations not read: GET /metrics: HTTP 404",)


@pytest.mark.asyncio
async def test_a_page_that_cannot_vouch_for_kv_canary_leaves_the_run_inconclusive(serve):
    """A page without the engine's `dsv4_kv_canary_armed` (a plugin that never loaded, an
    engine whose page the router dropped) is not "0 violations"."""
    _, url = await serve(kv_canary_armed=False)
    result = await run_probes(_settings(url, requests=600, kv_canary=True))
    assert result.verdict is Verdict.INCONCLUSIVE
    assert result.reasons == (
        "kv-canary violations not read: no engine on the page serves dsv4_kv_canary_armed "
        "(its kv-canary check is not counted)",
    )
