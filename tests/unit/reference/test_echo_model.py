"""The echo model in-process: exact echoes through the real pools, and garbled ones when the
index-K race is injected."""

from __future__ import annotations

import random
import threading

import pytest

from dsv4_engine.engine_config import ReferenceModelKind
from dsv4_engine.features import IndexDtype
from dsv4_engine.pools.layout import BufferKind
from dsv4_engine.probe.dsml import DsmlFormat
from dsv4_engine.probe.dsml_format import render_dsml
from dsv4_engine.probe.probes import _requested_turn
from dsv4_engine.probe.workload import ECHO_TOOL, document, echo_instruction, random_echo
from dsv4_engine.reference import chat, tokenizer
from dsv4_engine.reference.echo import codes, parser
from dsv4_engine.reference.echo.codes import Tag
from dsv4_engine.reference.echo.model import (
    MAX_CONTEXT,
    ROW_DIMS,
    pack_controller,
    pack_parse,
    unpack_rows,
)
from dsv4_engine.reference.echo.program import Controller, Phase
from dsv4_engine.reference.engine import Engine, Request
from dsv4_engine.reference.settings import ECHO_CONTEXT, ServeSettings

TIMEOUT_S = 120
TOOLS = {"tools": [ECHO_TOOL], "tool_choice": "auto"}


def echo_prompt(seed: int, system: str | None = None) -> tuple[list[int], str]:
    """(prompt ids, the exact answer) of the probes' echo request."""
    echo = random_echo(random.Random(seed))
    messages = [{"role": "user", "content": echo_instruction(echo)}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    ids = chat.prompt_ids({"messages": messages, **TOOLS})
    return ids, render_dsml(DsmlFormat.V4, echo.tool, echo.args)


def answers(engine: Engine, prompts: list[list[int]], max_tokens: int = 600) -> list[str]:
    outs: list[list[int]] = [[] for _ in prompts]
    reasons: list[str] = []
    left = threading.Semaphore(0)

    def done(reason: str, error: str | None) -> None:
        assert error is None, error
        reasons.append(reason)
        left.release()

    for ids, out in zip(prompts, outs, strict=True):
        engine.submit(Request(ids, max_tokens, out.append, done))
    for _ in prompts:
        assert left.acquire(timeout=TIMEOUT_S), "engine did not finish in time"
    return [tokenizer.decode(out) for out in outs]


@pytest.fixture
def make_engine():
    engines: list[Engine] = []

    def make(**kw) -> Engine:
        engine = Engine(ServeSettings(reference_model=ReferenceModelKind.ECHO, **kw))
        engine.start()
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.stop()


@pytest.mark.parametrize("dtype", list(IndexDtype))
def test_answers_the_echo_prompt_exactly_on_every_index_k_dtype(make_engine, dtype):
    """The copies go through index-K stored as fp8, bf16 or fp4: the one-hot codes survive
    each exactly, so the answer is the call the probes ask for, and the turn ends there."""
    engine = make_engine(index_dtype=dtype)
    prompts = [echo_prompt(1), echo_prompt(2, document(random.Random(2), 120, "L2"))]
    assert answers(engine, [ids for ids, _ in prompts]) == [want for _, want in prompts]


def test_answers_the_last_turn_of_a_conversation(make_engine):
    """Two turns with the same keys: the values come from the turn being answered."""
    rng = random.Random(3)
    first, second = random_echo(rng), random_echo(rng)
    messages = [{"role": "user", "content": echo_instruction(first)}]
    messages += _requested_turn(first, "call_0")
    messages.append({"role": "user", "content": echo_instruction(second)})
    ids = chat.prompt_ids({"messages": messages, **TOOLS})
    (answer,) = answers(make_engine(), [ids])
    assert answer == render_dsml(DsmlFormat.V4, second.tool, second.args)


def test_without_tools_it_recites_the_conversation(make_engine):
    """No tool to call: it copies the conversation from its start, so warm-vs-cold
    consistency has something the race can change."""
    body = {"messages": [{"role": "system", "content": "Document A: alpha beta gamma."},
                         {"role": "user", "content": "Continue the text."}]}  # fmt: skip
    (answer,) = answers(make_engine(), [chat.prompt_ids(body)], max_tokens=12)
    assert answer == "Document A: "


def test_a_cached_prefix_gives_the_cold_answer(make_engine):
    engine = make_engine()
    ids, want = echo_prompt(4, document(random.Random(4), 150, "P"))
    assert answers(engine, [ids]) == [want]
    cached = engine.stats.cached_tokens
    assert answers(engine, [ids]) == [want]
    assert engine.stats.cached_tokens > cached  # the second answer started from the cache


def _race(make_engine, share: float) -> tuple[list[tuple[str, str]], int]:
    """Cold answers, every prefix pushed to the host tier, then the same requests again, in
    one batch, answered while their prefixes load back: (warm answer, exact answer) each,
    and the index-K reads the pool saw reading a page before its load landed."""
    engine = make_engine(enable_hierarchical_cache=True, hicache_ratio=2.0,
                         index_dtype=IndexDtype.BF16)  # fmt: skip
    engine.pool.ungated_share = share
    rng = random.Random(5)
    prompts = [echo_prompt(10 + i, document(rng, 60 + 9 * i, f"L{i}")) for i in range(4)]
    ids = [p for p, _ in prompts]
    assert answers(engine, ids) == [want for _, want in prompts]
    engine.call(engine.offload).result(timeout=TIMEOUT_S)
    warm = list(zip(answers(engine, ids), [want for _, want in prompts], strict=True))
    return warm, engine.pool.stale_reads(BufferKind.INDEX_K)


def test_with_the_gate_answers_loaded_back_from_the_host_tier_are_exact(make_engine):
    warm, stale = _race(make_engine, 0.0)
    assert all(answer == want for answer, want in warm)
    assert stale == 0


def test_the_index_k_race_garbles_the_calls(make_engine):
    """Ungated, the trigger's schema lookups score the keys the reloaded pages held before
    (other prompts' pages, reused): the calls come out wrong — still DSML tool-call blocks,
    not prose."""
    warm, stale = _race(make_engine, 1.0)
    assert stale > 0
    assert any(answer != want for answer, want in warm)
    assert all(answer.startswith("\n\n<｜DSML｜tool_calls>") for answer, _ in warm)


def test_a_batch_answers_as_each_request_alone(make_engine):
    """Decoded together, each request's copy head looks up only its own entries: every
    request at the same positions holds another text there, and each answer is exact."""
    engine = make_engine()
    rng = random.Random(6)
    prompts = [echo_prompt(30 + i, document(rng, 20 + 11 * i, f"B{i}")) for i in range(6)]
    assert answers(engine, [ids for ids, _ in prompts]) == [want for _, want in prompts]


# -- the parts -------------------------------------------------------------------------


def test_the_reader_tags_what_the_answer_is_built_from():
    ids, _ = echo_prompt(6)
    state, tags, triggers = parser.ParseState(), [], []
    for pos, token in enumerate(ids):
        tag, trigger = parser.step(state, token, pos)
        tags += [tag] if tag else []
        triggers += [pos] if trigger else []
    kinds = [t[0] for t in tags]
    assert kinds == [Tag.START, Tag.TOOL_NAME, *[Tag.SCHEMA_PROP] * 4, *[Tag.INSTR_VALUE] * 4]
    text = tokenizer.decode(ids)
    tool_start = tags[1][3]
    assert tokenizer.decode(ids[tool_start : tool_start + 11]) == "record_echo"
    names = [tokenizer.decode(ids[t[4] : t[4] + 12]).split('"')[0] for t in tags[2:6]]
    assert names == ["record_id", "token", "count", "urgent"]
    assert [t[3] for t in tags[2:6]] == [t[1] for t in tags[6:]]  # a key's hash finds its value
    assert [t[2] for t in tags[6:]] == [1] * 4  # the first user turn
    assert triggers == [len(ids) - 1] and text.endswith("<｜Assistant｜></think>")


def test_rows_round_trip_through_bf16():
    state = parser.ParseState(region=2, turn=3, string_start=16000, string_hash=4095, props=4)
    ctrl = Controller(phase=Phase.VALUE, offset=7, ptr=16383, tool=900, held_entry=4096)
    ctrl.names[5], ctrl.held[3] = 12345, tokenizer.EOS_ID
    row = pack_parse(tokenizer.EOS_ID, state) + pack_controller(ctrl)
    assert len(row) == ROW_DIMS
    import torch

    stored = torch.zeros((1, ECHO_CONTEXT // 256)).to(torch.bfloat16)
    stored[0, :ROW_DIMS] = torch.tensor(row, dtype=torch.float32)
    ((back_state, back_ctrl),) = unpack_rows(stored.to(torch.float32))
    assert (back_state, back_ctrl) == (state, ctrl)
    with pytest.raises(ValueError, match="do not fit"):
        pack_parse(0, parser.ParseState(props=256))


def test_the_engine_flag_and_the_model_agree_on_the_longest_context():
    assert ECHO_CONTEXT == MAX_CONTEXT == 4 * codes.MAX_ENTRIES


@pytest.mark.parametrize("dtype", list(IndexDtype))
def test_a_query_scores_its_own_entry_strictly_highest_after_storage(dtype):
    """Keys through the pool's quantizer: position and tag codes keep their margins."""
    import torch

    from dsv4_engine.index_k import index_key_format
    from dsv4_engine.kernels import index_k_ref

    n = 300
    tags = torch.tensor([[Tag.INSTR_VALUE, (7 * i) % 4096, i % 16] for i in range(n)])
    keys = codes.entry_keys(torch.arange(1000, 1000 + n), tags)
    fmt = index_key_format(dtype, codes.INDEX_DIM)
    stored = index_k_ref.dequantize(*index_k_ref.quantize(keys, fmt), fmt)
    for i in (0, 57, n - 1):
        by_position = stored @ codes.position_query(1000 + i)
        by_tag = stored @ codes.tag_query(Tag.INSTR_VALUE, (7 * i) % 4096, i % 16)
        for scores, exact in ((by_position, 3.0), (by_tag, codes.exact_tag_score(True))):
            assert float(scores[i]) == exact
            assert float(torch.cat([scores[:i], scores[i + 1 :]]).max()) < exact
