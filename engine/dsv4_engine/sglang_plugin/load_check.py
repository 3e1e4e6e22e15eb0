"""Proof that SGLang itself loads this plugin and applies every hook of it.

    python -m dsv4_engine.sglang_plugin.load_check     # exit 0: every hook applied

It runs SGLang's own ``load_plugins()`` (what ``sglang.launch_server`` and every scheduler
process do first) with the plugin whitelisted as ``dsv4-engine launch`` whitelists it, then
checks that the target of each hook (``HOOKS``, ``AFTER_HOOKS``) now holds SGLang's wrapper
around the plugin's function, and that the kv-canary counter is on SGLang's violation
logger.  Exit 1 names each that is missing.

Why: that the entry point is registered says only that SGLang can find it; ``load_plugins()``
logs and swallows a plugin that fails to import or register, and ``HookRegistry`` a hook it
cannot apply, and the engine would start without them.  The engine image runs this at build
time (images/engine/Dockerfile) on the SGLang it ships; tests/sglang runs it on the pinned
SGLang.  It needs no GPU: the hooks wrap methods of SGLang's classes, nothing runs them.
"""

from __future__ import annotations

import logging
import os
import pkgutil
import sys
from collections.abc import Callable
from typing import Any

from dsv4_engine.commands.launch import PLUGIN_ENTRY_POINT
from dsv4_engine.engine_config import PLUGINS_ENV
from dsv4_engine.kv_canary import SGLANG_LOGGER
from dsv4_engine.sglang_plugin import AFTER_HOOKS, HOOKS
from dsv4_engine.sglang_plugin.kv_canary import ViolationCounter


def installed(target: str, hook: Callable[..., Any]) -> bool:
    """Whether the target's owner now holds SGLang's wrapper (``hook_registry._wrap_fn``:
    ``__wrapped__`` set, the hook in its closure) around `hook`."""
    owner_path, _, method = target.rpartition(".")
    wrapper = vars(pkgutil.resolve_name(owner_path)).get(method)
    closure = getattr(wrapper, "__closure__", None) or ()
    return hasattr(wrapper, "__wrapped__") and any(c.cell_contents is hook for c in closure)


def missing() -> list[str]:
    """What SGLang's ``load_plugins()`` did not install (call it in a fresh process: plugin
    loading is process-wide and happens once)."""
    from sglang.srt.plugins import load_plugins

    os.environ[PLUGINS_ENV] = PLUGIN_ENTRY_POINT
    load_plugins()
    out = [
        f"hook {hook.__name__} on {target}"
        for target, hook in (*HOOKS, *AFTER_HOOKS)
        if not installed(target, hook)
    ]
    handlers = logging.getLogger(SGLANG_LOGGER).handlers
    if not any(isinstance(h, ViolationCounter) for h in handlers):
        out.append(f"the kv-canary violation counter on logger {SGLANG_LOGGER}")
    return out


def main() -> int:
    import sglang

    absent = missing()
    for what in absent:
        print(f"FAIL not installed: {what}")
    hooks = len(HOOKS) + len(AFTER_HOOKS)
    if absent:
        print(
            f"load check: SGLang {sglang.__version__}'s load_plugins() did NOT install "
            f"{PLUGIN_ENTRY_POINT} whole ({len(absent)} missing)"
        )
        return 1
    print(
        f"load check: SGLang {sglang.__version__}'s load_plugins() loaded {PLUGIN_ENTRY_POINT} "
        f"and applied its {hooks} hooks and its kv-canary counter"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
