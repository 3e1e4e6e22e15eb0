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
raised while the pools are sized stops the engine before any memory is allocated.

The hooks target private SGLang methods, and ``HookRegistry.apply_hooks`` logs and
swallows a target it cannot resolve: after an SGLang rename the plugin would be silently
inert and bf16 would run as fp8 again.  So ``register()`` first resolves each target the
way the registry will (``pkgutil.resolve_name`` of its owner, then the attribute) and,
for one that does not resolve, raises ``SystemExit`` naming the hook, the target and the
pinned SGLang version: not an ``Exception``, so ``load_plugins()`` does not swallow it and
the process stops (``launch_server`` loads plugins first thing, before parsing arguments).

The plugin does not gate reads: SGLang 0.5.23's DeepSeek-V4 pool getters wait for their
layer's HiCache load themselves; ``gate_check`` proves it for the pinned SGLang.

In the HTTP server's process it closes SGLang's management endpoints (weight updates, LoRA,
pause, memory release, ...): every call to them is refused (``admin_surface``).

It also counts SGLang's kv-canary violations (logged, never counted by SGLang) into a
Prometheus counter on the engine's /metrics, and marks that counter armed once SGLang's
check runs (``kv_canary``), where the canary's probe reads both.

And it judges every tool-call answer the chat server serves, streamed and not, off the
response path, into ``dsv4_engine_tool_call_answers_total{revision,role,outcome}`` and an
output-length histogram (``live_judge``; a PD prefill server judges nothing).
"""

from __future__ import annotations

import os
import pkgutil
from collections.abc import Callable
from typing import Any

from dsv4_engine.configurator.errors import ConfigError
from dsv4_engine.engine_config import INDEX_DTYPE_ENV as ENV_INDEX_DTYPE
from dsv4_engine.features import IndexDtype
from dsv4_engine.index_k import SGLANG_VERSION, sglang_index_dtype_error
from dsv4_engine.sglang_plugin import admin_surface, kv_canary, live_judge

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


HOOKS: tuple[tuple[str, Callable[..., Any]], ...] = (
    (DSA_TARGET, refuse_unstored_index_dtype),
    (DSV4_TARGET, refuse_unstored_index_dtype),
    (live_judge.STREAM_TARGET, live_judge.judge_stream),
    (live_judge.CONTENT_TARGET, live_judge.note_stream_tokens),
)
# Hooks that run after their target (SGLang's HookType.AFTER): the kv-canary's armed mark,
# the live judge's start and its judging of non-streamed answers.
AFTER_HOOKS: tuple[tuple[str, Callable[..., Any]], ...] = (
    (kv_canary.REPORTER_TARGET, kv_canary.mark_armed),
    (live_judge.INIT_TARGET, live_judge.start),
    (live_judge.RESPONSE_TARGET, live_judge.judge_response),
)
# What running without each hook would do (what a hook that cannot apply stops with).
WITHOUT: dict[Callable[..., Any], str] = {
    refuse_unstored_index_dtype: "SGLang would size and run a bf16 index-K request as fp8",
    kv_canary.mark_armed: "the engine's kv-canary check would never be vouched for, and "
    "every canary probing it would end INCONCLUSIVE",
    live_judge.start: "no served tool-call answer would be judged, and the live outcome "
    "counters would be missing from /metrics",
    live_judge.judge_response: "non-streamed tool-call answers would go unjudged and uncounted",
    live_judge.judge_stream: "streamed tool-call answers would go unjudged and uncounted",
    live_judge.note_stream_tokens: "streamed tool-call answers would be judged without "
    "their output length",
}


def unresolved_target(target: str) -> str | None:
    """Why SGLang's HookRegistry could not wrap `target`, or None when it can: it resolves
    the owner with ``pkgutil.resolve_name``, takes the attribute, and wraps only a function
    (``HookRegistry._apply_target``)."""
    owner_path, _, attribute = target.rpartition(".")
    try:
        found = getattr(pkgutil.resolve_name(owner_path), attribute)
    except (ImportError, AttributeError, ValueError) as err:
        return f"{type(err).__name__}: {err}"
    if isinstance(found, type) or not callable(found):
        return f"it is a {type(found).__name__}, not a function"
    return None


def hook_not_applicable(target: str, hook: Callable[..., Any], why: str) -> str:
    """What the engine stops with: the hook, its SGLang target, the pinned and the installed
    SGLang version, and what running without the hook would do."""
    import sglang

    without = WITHOUT.get(hook, "")
    return (
        f"dsv4_index_k: SGLang cannot apply hook {hook.__name__} to {target} ({why}). "
        f"The plugin is written for SGLang {SGLANG_VERSION}; this is SGLang "
        f"{sglang.__version__}. Without the hook {without}: refusing to start."
    )


def register() -> None:
    """The ``sglang.srt.plugins`` entry point: SGLang applies the hooks after all plugins
    have registered; one it could not apply stops the process here (see above)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    unapplicable = [
        hook_not_applicable(target, hook, why)
        for target, hook in (*HOOKS, *AFTER_HOOKS)
        if (why := unresolved_target(target)) is not None
    ]
    if unapplicable:
        raise SystemExit("\n".join(unapplicable))
    for target, hook in HOOKS:
        HookRegistry.register(target, hook, HookType.AROUND)
    for target, hook in AFTER_HOOKS:
        HookRegistry.register(target, hook, HookType.AFTER)
    kv_canary.install()
    admin_surface.install()
