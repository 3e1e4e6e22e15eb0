"""The prefill→decode wire format of one engine configuration: what a prefill engine and a
decode engine must agree on to hand a request over.

Read off SGLang 0.5.23's own handshake (`sglang/srt/disaggregation/common/conn.py`,
`try_ensure_parallel_info`): the decode side refuses a prefill whose page size, KV cache
dtype or DeepSeek-V4 KV layout (`DeepSeekV4TokenToKVPool.pd_kv_layout`, set by
`--dsv4-attn-backend` and `SGLANG_DSV4_KV_LAYOUT` / `SGLANG_DSV4_COMPRESSED_KV_LAYOUT`)
differ, and a DSpark speculative layout that differs.  That check is not enough: two KV
layouts of one dtype can pass it and still mis-transfer (sglang#37838), and a prefill
without speculative decoding paired with a decode that uses it answers wrongly
(sglang#17212).  So the key is wider than SGLang's check: everything here that can change
the bytes shipped per token, or how the receiver reads them.

Pure: the operator derives the transfer key of a revision from it (`render.transfer`).
"""

from __future__ import annotations

from collections.abc import Sequence

from dsv4_engine.engine_config import EngineConfig
from dsv4_engine.features import transfer_contract

# Extra arguments that change the wire format (checked against SGLang's parser in
# tests/sglang/test_wire.py).  Every speculative-decoding flag counts: drafts ship their
# own KV with the target's (`num_draft_entries` in SGLang's KV args).
WIRE_FLAGS: tuple[str, ...] = (
    "--page-size",
    "--c128-page-size",
    "--kv-cache-dtype",
    "--dsv4-attn-backend",
    "--enable-unified-memory",
)
WIRE_FLAG_PREFIX = "--speculative-"
# Environment variables SGLang 0.5.23 reads to lay out DeepSeek-V4's KV pages.
WIRE_ENV: tuple[str, ...] = ("SGLANG_DSV4_KV_LAYOUT", "SGLANG_DSV4_COMPRESSED_KV_LAYOUT")


def _wire_flag(token: str) -> str | None:
    """The wire flag an argument token sets (argparse accepts a unique prefix), else None."""
    if not token.startswith("--"):
        return None
    flag = token.split("=", 1)[0]
    if flag.startswith(WIRE_FLAG_PREFIX):
        return flag
    matches = [listed for listed in WIRE_FLAGS if listed.startswith(flag)]
    return matches[0] if len(matches) == 1 else None


def wire_args(extra_args: Sequence[str]) -> list[str]:
    """The wire-format arguments among ``extra_args``, each as `flag=value` (or `flag`),
    sorted: the same settings written two ways give the same list."""
    found = []
    for i, token in enumerate(extra_args):
        flag = _wire_flag(token)
        if flag is None:
            continue
        if "=" in token:
            found.append(f"{flag}={token.split('=', 1)[1]}")
        elif i + 1 < len(extra_args) and not extra_args[i + 1].startswith("--"):
            found.append(f"{flag}={extra_args[i + 1]}")
        else:
            found.append(flag)
    return sorted(found)


def wire_format(config: EngineConfig, env: Sequence[tuple[str, str]], build: str) -> dict:
    """What one role's engine puts on the wire, as a JSON-able dict.

    ``env``: the pod's environment (name, value); ``build``: the engine image as the spec
    names it (another build may lay pages out differently)."""
    return {
        "backend": config.backend.value,
        "build": build,
        "model": {
            "path": config.model_path,
            "reference": config.reference_model.value,
        },
        "features": transfer_contract(config.features),
        "transferBackend": config.disaggregation.transfer_backend.value,
        "args": wire_args(config.extra_args),
        "env": sorted(f"{name}={value}" for name, value in env if name in WIRE_ENV),
    }
