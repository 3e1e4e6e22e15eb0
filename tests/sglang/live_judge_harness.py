"""Serves chat answers through SGLang 0.5.23's real ``OpenAIServingChat`` with the
project's plugin loaded, and prints what the client got and the engine's /metrics page.

Run as a script in its own process (plugins, hooks, the runtime context and the
multiprocess Prometheus directory are process-wide).  Arguments: MODEL_DIR MODE (SGLang's
``--disaggregation-mode``: null, decode or prefill).  Stdin: JSON cases
``[{"id", "text", "finish": "stop"|"length", "stream": bool, "messages": [...],
"tools": [...]?}]``: the request (no ``tools``: none offered), and the raw text a
DeepSeek-V4 model wrote for it.

What is real: SGLang's ``set_prometheus_multiproc_dir`` and ``load_plugins`` (which apply
the plugin's hooks), its runtime context published from its own ``ServerArgs``
(``--tool-call-parser deepseekv4``), the serving class built by its own ``__init__`` (so the
``deepseekv4`` parser runs as served: the deepseek-recipe output adapter reading token ids),
its ``_build_chat_response`` and ``_generate_chat_stream``, and the /metrics page rendered
as SGLang renders it (a multiprocess collector).  What stands in: the tokenizer manager,
whose ``generate_request`` yields the outputs a scheduler would (the text's token ids, in
steps of 5), and the checkpoint's tokenizer — a byte-level ``tokenizers`` BPE with
DeepSeek-V4's special tokens (``｜DSML｜``, ``</think>``, ...) as added tokens, which is
what the parser recognises by id.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from types import SimpleNamespace
from typing import Any

import torch

torch.cuda.get_device_capability = lambda *a, **k: (9, 0)  # resolving args, no GPU here

SPECIALS = (
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜System｜>",
    "<｜latest_reminder｜>",
    "<think>",
    "</think>",
    "｜DSML｜",
)
EOS_ID = 257  # after the 256 byte symbols, in SPECIALS' order
STEP = 5


def tokenizer() -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIALS[0],
                                   eos_token=SPECIALS[1])  # fmt: skip


def meta(rid: str, ids: list[int], finish: str | None) -> dict[str, Any]:
    reason = None
    if finish == "stop":
        reason = {"type": "stop", "matched": EOS_ID}
    elif finish == "length":
        reason = {"type": "length", "length": len(ids)}
    return {"id": rid, "finish_reason": reason, "prompt_tokens": 12,
            "completion_tokens": len(ids), "cached_tokens": 0,
            "weight_version": "default"}  # fmt: skip


async def generate_request(adapted: Any, _raw: Any):
    """The scheduler's outputs for one request: cumulative text and ids, every STEP ids."""
    ids, hf = adapted.ids, adapted.hf
    for end in range(STEP, len(ids) + STEP, STEP):
        part = ids[: min(end, len(ids))]
        done = end >= len(ids)
        yield {"index": 0, "text": hf.decode(part), "output_ids": list(part),
               "meta_info": meta(adapted.rid, part, adapted.finish if done else None)}  # fmt: skip


def main() -> None:
    model_dir, mode = sys.argv[1], sys.argv[2]
    cases = json.loads(sys.stdin.read())
    from sglang.srt.utils.common import set_prometheus_multiproc_dir

    set_prometheus_multiproc_dir()
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.srt import runtime_context
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
    from sglang.srt.server_args import ServerArgs

    sa = ServerArgs(model_path=model_dir, device="cuda", tool_call_parser="deepseekv4",
                    disaggregation_mode=mode, enable_metrics=True)  # fmt: skip
    runtime_context.publish(sa, role="test")
    hf = tokenizer()
    manager = SimpleNamespace(
        config_value=lambda name: getattr(sa, name),
        model_config=SimpleNamespace(
            hf_config=SimpleNamespace(
                architectures=["DeepseekV4ForCausalLM"], model_type="deepseek_v4"
            ),
            get_default_sampling_params=lambda: {},
        ),
        tokenizer=hf,
        model_path=model_dir,
        server_args=sa,
        served_model_name="deepseek-v4-flash",
        disaggregation_mode=DisaggregationMode(mode),
        generate_request=generate_request,
    )
    serving = OpenAIServingChat(manager, SimpleNamespace(force_reasoning=False))
    assert serving._encoding_output() is not None, "the deepseekv4 parser's output adapter"

    async def serve(case: dict[str, Any]) -> dict[str, Any]:
        tools = {"tools": case["tools"]} if case.get("tools") else {}
        request = ChatCompletionRequest(model="deepseek-v4-flash", messages=case["messages"],
                                        stream=case["stream"], **tools)  # fmt: skip
        ids = hf.encode(case["text"], add_special_tokens=False)
        adapted = SimpleNamespace(ids=ids, hf=hf, rid=case["id"], finish=case["finish"])
        if not case["stream"]:
            ret = [item async for item in generate_request(adapted, None)][-1:]
            response = serving._build_chat_response(request, ret, int(time.time()))
            choice = response.choices[0]
            return {"message": choice.message.model_dump(exclude_none=True),
                    "finish_reason": choice.finish_reason}  # fmt: skip
        chunks = [c async for c in serving._generate_chat_stream(adapted, request, None)]
        from dsv4_engine.live_judge import StreamedMessage

        joined = StreamedMessage()
        for chunk in chunks:
            body = chunk.removeprefix("data: ").strip()
            if body != "[DONE]":
                for choice in json.loads(body)["choices"]:
                    joined.add_choice(choice)
        return {"message": joined.message(), "finish_reason": joined.finish_reason}

    for case in cases:
        print("SERVED " + json.dumps({"id": case["id"], **asyncio.run(serve(case))}))
    from dsv4_engine.sglang_plugin import live_judge

    judge = live_judge.current()
    print("JUDGE " + json.dumps(None if judge is None else judge.role))
    if judge is not None:
        assert judge.drain()
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    sys.stdout.write(generate_latest(registry).decode())


if __name__ == "__main__":
    main()
