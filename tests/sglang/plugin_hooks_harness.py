"""Loads the installed SGLang plugins as an engine process does, then prints which of the
project plugin's hooks SGLang installed (one JSON line), and how many kv-canary violation
counters are on SGLang's violation logger and whether prometheus_client is imported yet
(a second one).

Run as a script in its own process (SGLang's hooks and plugin loading are process-wide).
Argument ``--rename CLASS_PATH.METHOD``: first rename that method of SGLang's real class
(``METHOD`` becomes ``METHOD_renamed``), as an SGLang release that renamed it would.
"""

from __future__ import annotations

import json
import logging
import pkgutil
import sys

from dsv4_engine.kv_canary import SGLANG_LOGGER
from dsv4_engine.sglang_plugin import HOOKS
from dsv4_engine.sglang_plugin.kv_canary import ViolationCounter
from dsv4_engine.sglang_plugin.load_check import installed


def rename(target: str) -> None:
    owner_path, _, method = target.rpartition(".")
    owner = pkgutil.resolve_name(owner_path)
    setattr(owner, f"{method}_renamed", vars(owner)[method])
    delattr(owner, method)


def main() -> None:
    from sglang.srt.plugins import load_plugins

    if "--rename" in sys.argv:
        rename(sys.argv[sys.argv.index("--rename") + 1])
    load_plugins()  # what launch_server.py and every scheduler process do first
    print("RESULT " + json.dumps({target: installed(target, hook) for target, hook in HOOKS}))
    handlers = logging.getLogger(SGLANG_LOGGER).handlers
    counters = sum(isinstance(h, ViolationCounter) for h in handlers)
    print("KV_CANARY " + json.dumps([counters, "prometheus_client" in sys.modules]))


if __name__ == "__main__":
    main()
