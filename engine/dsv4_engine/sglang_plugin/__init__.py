"""SGLang plugin: size the lightning indexer's keys right when they are stored in bf16.

Loaded by SGLang's ``load_plugins()`` in every engine process through the entry point
``dsv4_index_k`` of group ``sglang.srt.plugins`` (whitelist it with
``SGLANG_PLUGINS=dsv4_index_k``).  It hooks both places SGLang 0.5.23 prices index-K
bytes, so the coefficient SGLang sizes its pools with is the configurator's:

- ``DefaultPoolConfigurator._compute_dsa_indexer_cell_size`` (DSA models): SGLang prices
  each key with the fp8 formula times the element size of the index-K buffer dtype; a
  bf16 buffer thus costs 2 x 132 B instead of 256 B (the seed's legacy bug).
- ``DSV4PoolConfigurator._get_bytes_per_full_token`` (DeepSeek-V4): SGLang prices each key at the fp8 size
  whatever the buffer holds, so a bf16 index-K (256 B) would be under-budgeted.

The index-K dtype comes from ``DSV4_INDEX_DTYPE`` (fp8 | bf16 | fp4, default fp8), set
by ``dsv4-engine launch``.  For fp8 and fp4 the hooks return SGLang's own result
untouched.  The hooks keep SGLang's layer counting, HiSparse ratio and page logic and
only replace the per-key byte count, taken from ``dsv4_engine.configurator``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from dsv4_engine.configurator.errors import ConfigError
from dsv4_engine.configurator.index_k import fp8_index_k_bytes, index_k_bytes_per_token
from dsv4_engine.features import IndexDtype

ENV_INDEX_DTYPE = "DSV4_INDEX_DTYPE"
_CONFIGURATORS = "sglang.srt.model_executor.pool_configurator"
DSA_TARGET = f"{_CONFIGURATORS}.DefaultPoolConfigurator._compute_dsa_indexer_cell_size"
DSV4_TARGET = f"{_CONFIGURATORS}.DSV4PoolConfigurator._get_bytes_per_full_token"

logger = logging.getLogger(__name__)


def configured_index_dtype() -> IndexDtype:
    value = os.environ.get(ENV_INDEX_DTYPE, IndexDtype.FP8.value).strip().lower()
    try:
        return IndexDtype(value)
    except ValueError:
        raise ConfigError(
            f"{ENV_INDEX_DTYPE}: expected one of fp8, bf16, fp4, got {value!r}"
        ) from None


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def dsa_indexer_cell_size(original: Callable[..., int], self: Any, **kwargs: Any) -> int:
    """AROUND hook: rescale SGLang's indexer cell size from its per-key price to bf16's."""
    size = original(self, **kwargs)
    if configured_index_dtype() is not IndexDtype.BF16:
        return size
    import torch
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool

    hf_config = kwargs["kvc"].model_config.hf_config
    head_dim = hf_config.index_head_dim
    kpool = getattr(hf_config, "index_kpool", 1) or 1
    element = torch._utils._element_size(DSATokenToKVPool.index_k_with_scale_buffer_dtype)
    sglang_price = _ceil_div(fp8_index_k_bytes(head_dim), kpool) * element
    bf16_price = _ceil_div(index_k_bytes_per_token(head_dim, IndexDtype.BF16), kpool)
    return size // sglang_price * bf16_price


def dsv4_bytes_per_full_token(original: Callable[..., float], self: Any) -> float:
    """AROUND hook: price index-K at the bf16 size before SGLang sums the coefficient, so
    its own speculative-decoding inflation and sizing apply unchanged afterwards."""
    if configured_index_dtype() is IndexDtype.BF16:
        self.indexer_bytes_per_token = index_k_bytes_per_token(
            self.indexer_head_dim, IndexDtype.BF16
        )
        logger.info(
            "dsv4 plugin: bf16 index-K priced at %d B per compressed token",
            self.indexer_bytes_per_token,
        )
    return original(self)


def register() -> None:
    """The ``sglang.srt.plugins`` entry point: SGLang applies the hooks after all plugins
    have registered."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    configured_index_dtype()  # fail at startup, not at sizing time, on a bad value
    HookRegistry.register(DSA_TARGET, dsa_indexer_cell_size, HookType.AROUND)
    HookRegistry.register(DSV4_TARGET, dsv4_bytes_per_full_token, HookType.AROUND)
