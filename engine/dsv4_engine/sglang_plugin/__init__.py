"""SGLang plugin: refuse an index-K dtype SGLang's pools do not store, before they are sized.

Loaded by SGLang's ``load_plugins()`` in every engine process through the entry point
``dsv4_index_k`` of group ``sglang.srt.plugins`` (whitelist it with
``SGLANG_PLUGINS=dsv4_index_k``).  The index-K dtype comes from ``DSV4_INDEX_DTYPE``
(fp8 | fp4 | bf16, default fp8), set by ``dsv4-engine launch``.

SGLang 0.5.23 stores DeepSeek-V4 (and DSA) index-K as fp8 or fp4 rows only (its indexer
buffers are ``uint8``; fp4 is ``--enable-deepseek-v4-fp4-indexer``).  Asked for bf16 it
would size and run fp8 while the deployment says bf16, so a canary would "pass" a flag that
changed nothing.  The plugin hooks both places SGLang prices index-K bytes
(``DSV4PoolConfigurator._get_bytes_per_full_token`` and
``DefaultPoolConfigurator._compute_dsa_indexer_cell_size``) and raises there, naming
``indexDtype``, for a dtype SGLang does not store (``dsv4_engine.index_k``, the one rule);
for fp8 and fp4 SGLang's own result is returned untouched.

Why at sizing time and not in ``register()``: ``load_plugins()`` logs and swallows an
exception a plugin's entry point raises and the engine starts anyway, while an exception
raised while the pools are sized stops the engine before any memory is allocated.  So
``register()`` only registers and never raises.

The plugin does not gate reads: SGLang 0.5.23's DeepSeek-V4 pool getters wait for their
layer's HiCache load themselves; ``gate_check`` proves it for the pinned SGLang.

It also counts SGLang's kv-canary violations (logged, never counted by SGLang) into a
Prometheus counter on the engine's /metrics (``kv_canary``), where the canary's probe reads it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from dsv4_engine.configurator.errors import ConfigError
from dsv4_engine.engine_config import INDEX_DTYPE_ENV as ENV_INDEX_DTYPE
from dsv4_engine.features import IndexDtype
from dsv4_engine.index_k import sglang_index_dtype_error
from dsv4_engine.sglang_plugin import kv_canary

_CONFIGURATORS = "sglang.srt.model_executor.pool_configurator"
DSA_TARGET = f"{_CONFIGURATORS}.DefaultPoolConfigurator._compute_dsa_indexer_cell_size"
DSV4_TARGET = f"{_CONFIGURATORS}.DSV4PoolConfigurator._get_bytes_per_full_token"


def configured_index_dtype() -> IndexDtype:
    value = os.environ.get(ENV_INDEX_DTYPE, IndexDtype.FP8.value).strip().lower()
    try:
        return IndexDtype(value)
    except ValueError:
        raise ConfigError(
            f"{ENV_INDEX_DTYPE}: expected one of fp8, bf16, fp4, got {value!r}"
        ) from None


def refuse_unstored_index_dtype(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """AROUND hook: SGLang's own index-K pricing, once the dtype is one SGLang stores."""
    refusal = sglang_index_dtype_error(configured_index_dtype())
    if refusal is not None:
        raise ConfigError(f"{ENV_INDEX_DTYPE}: {refusal}")
    return original(*args, **kwargs)


def register() -> None:
    """The ``sglang.srt.plugins`` entry point: SGLang applies the hooks after all plugins
    have registered."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target in (DSA_TARGET, DSV4_TARGET):
        HookRegistry.register(target, refuse_unstored_index_dtype, HookType.AROUND)
    kv_canary.install()
