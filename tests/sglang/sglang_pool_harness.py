"""Runs real SGLang 0.5.23 pool configurators on a batch of cases; one JSON line per case.

Run as a script in its own process (SGLang keeps process-wide context): the parent test
sends the cases as JSON on stdin.  Each case publishes its own ServerArgs (SGLang's
runtime context is last-publish-wins), so cases of one batch do not share settings;
plugin hooks are process-wide, so a batch either loads the project's plugin or does not.

Stand-ins, because they cannot exist without a GPU: the loaded model (an object with no
attributes, as before weights are loaded), the PP group (single stage), the CUDA device
capability (Hopper) while server args resolve.  Everything else is SGLang's own code.
"""

from __future__ import annotations

import json
import os
import sys
import types
from typing import Any

import torch

torch.cuda.get_device_capability = lambda *a, **k: (9, 0)

from sglang.srt import runtime_context  # noqa: E402
from sglang.srt.configs.model_config import ModelConfig  # noqa: E402
from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator  # noqa: E402
from sglang.srt.model_executor import pool_configurator as pc  # noqa: E402
from sglang.srt.model_executor.model_runner_components.layer_setup import (  # noqa: E402
    resolve_layer_indices,
)
from sglang.srt.model_executor.model_runner_components.load_model_utils import (  # noqa: E402
    resolve_sliding_window_size,
)
from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import (  # noqa: E402
    SpecAuxHiddenStateConfig,
)
from sglang.srt.server_args import ServerArgs  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

KV_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "bfloat16": torch.bfloat16}


def build_kvc(case: dict[str, Any]) -> KVCacheConfigurator:
    sa = ServerArgs(model_path=case["model_dir"], device="cuda", **case["server_args"])
    runtime_context.publish(sa, role="scheduler")
    mc = ModelConfig.from_server_args(sa)
    model = types.SimpleNamespace()
    kv_dtype_str = runtime_context.get_model().kv_cache_dtype
    spec = SpeculativeAlgorithm.from_string(runtime_context.get_spec().speculative_algorithm)
    aux = SpecAuxHiddenStateConfig(eagle_draft_num_layers=1 if not spec.is_none() else None)
    return KVCacheConfigurator(
        device="cuda",
        gpu_id=0,
        attn_dp_size=runtime_context.get_parallel().attn_dp_size,
        pp_size=1,
        pp_group=types.SimpleNamespace(world_size=1, rank_in_group=0),
        model=model,
        model_config=mc,
        server_args=sa,
        kv_cache_dtype=KV_DTYPES.get(kv_dtype_str, torch.bfloat16),
        kv_cache_dtype_str=kv_dtype_str,
        model_dtype=mc.dtype,
        page_size=case.get("page_size") or runtime_context.get_schedule().page_size,
        sliding_window_size=resolve_sliding_window_size(model, mc),
        spec_algorithm=spec,
        is_draft_worker=False,
        post_capture_kv_active=False,
        spec_aux_config=aux,
        draft_parallel_layout=None,
        is_hybrid_swa=mc.is_hybrid_swa,
        is_hybrid_swa_compress=mc.is_hybrid_swa_compress,
        use_mla_backend=True,
        layer_info=resolve_layer_indices(model=model, model_config=mc, is_draft_worker=False),
        forward_stream=None,
        req_to_token_pool=None,
        token_to_kv_pool_allocator=None,
        memory_pool_config=None,
    )


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    if "index_head_dims" in case:
        # The rows DeepSeekV4IndexerPool allocates per compressed token, fp8 and fp4.
        from sglang.srt.mem_cache.deepseek_v4_memory_pool import (
            get_dsv4_indexer_bytes_per_token,
        )

        return {
            "rows": {
                str(d): [get_dsv4_indexer_bytes_per_token(d, fp4) for fp4 in (False, True)]
                for d in case["index_head_dims"]
            }
        }
    kvc = build_kvc(case)
    conf = pc.create_memory_pool_configurator(kvc)
    avail = case["available_bytes"]
    page = kvc.page_size
    out: dict[str, Any] = {"configurator": type(conf).__name__, "page_size": page}
    if isinstance(conf, pc.DSV4PoolConfigurator):
        mrr = conf._resolve_max_running_requests_per_worker(avail)
        cfg = conf.calculate_pool_sizes(avail, page)
        cfg.max_running_requests = mrr
        cfg = conf.finalize_with_max_running_requests(cfg)
        out |= {
            "bytes_per_full_token": conf.bytes_per_full_token,
            "fixed_bytes": conf._get_c128_state_fixed_bytes(mrr) + conf._get_swa_fixed_bytes(),
            "max_running_requests_per_worker": mrr,
            "indexer_bytes_per_token": conf.indexer_bytes_per_token,
            "swa_mode": "ratio" if conf.swa_cap_tokens is None else "cap",
            "full": cfg.full_max_total_num_tokens,
            "swa": cfg.swa_max_total_num_tokens,
            "c4": cfg.c4_max_total_num_tokens,
            "c128": cfg.c128_max_total_num_tokens,
            "c4_state": cfg.c4_state_pool_size,
            "c128_state": cfg.c128_state_pool_size,
        }
    else:
        cfg = conf.calculate_pool_sizes(avail, page)
        out |= {"bytes_per_full_token": float(conf._cell_size), "full": cfg.max_total_num_tokens}
    return out


def main() -> None:
    """Argument ``--plugin``: load the installed SGLang plugins first, as every engine
    process does.  Per case: ``index_dtype`` sets DSV4_INDEX_DTYPE (read by the plugin
    at sizing time); ``fork_bf16_buffer`` gives DSA index-K the bf16 buffer dtype of the
    seed's fork, whose element size is what multiplied SGLang's fp8 formula."""
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool

    if "--plugin" in sys.argv:
        from sglang.srt.plugins import load_plugins

        load_plugins()
    upstream_buffer_dtype = DSATokenToKVPool.index_k_with_scale_buffer_dtype
    for case in json.load(sys.stdin):
        os.environ["DSV4_INDEX_DTYPE"] = case.get("index_dtype", "fp8")
        DSATokenToKVPool.index_k_with_scale_buffer_dtype = (
            torch.bfloat16 if case.get("fork_bf16_buffer") else upstream_buffer_dtype
        )
        try:
            result = run_case(case)
        except Exception as err:  # reported per case; the test decides what it means
            result = {"error": f"{type(err).__name__}: {err}"}
        print("RESULT " + json.dumps({"id": case["id"], **result}), flush=True)


if __name__ == "__main__":
    main()
