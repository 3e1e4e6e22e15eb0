"""Runs the SGLang gate check (dsv4_engine.sglang_plugin.gate_check) on the real pool as
pinned, then with one getter broken at a time; one JSON line per scenario.

Run as a script in its own process (SGLang keeps process-wide context).  Each broken
scenario patches SGLang's class for its run only:

- ``no-wait:<getter>``: the getter runs with the pool's layer counter hidden, i.e. its
  ``wait_layer_transfer`` patched out (the seed fork's bug);
- ``next-layer:<getter>``: the getter first waits for the layer after its own;
- ``new-getter``: the pool grows a ``get_*`` method the check does not classify.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from collections.abc import Callable
from typing import Any

from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool as Pool

from dsv4_engine.sglang_plugin import gate_check


def without_wait(original: Callable[..., Any]) -> Callable[..., Any]:
    def getter(self: Any, layer_id: int, *args: Any) -> Any:
        counter, self.layer_transfer_counter = self.layer_transfer_counter, None
        try:
            return original(self, layer_id, *args)
        finally:
            self.layer_transfer_counter = counter

    return getter


def waiting_for_next_layer(original: Callable[..., Any]) -> Callable[..., Any]:
    def getter(self: Any, layer_id: int, *args: Any) -> Any:
        self.wait_layer_transfer(layer_id + 1)
        return without_wait(original)(self, layer_id, *args)

    return getter


def run(scenario: str) -> dict[str, Any]:
    kind, _, name = scenario.partition(":")
    patched: list[tuple[str, Any]] = []
    if kind in ("no-wait", "next-layer"):
        patch = without_wait if kind == "no-wait" else waiting_for_next_layer
        patched.append((name, vars(Pool)[name]))
        setattr(Pool, name, patch(vars(Pool)[name]))
    elif kind == "new-getter":
        name = "get_new_buffer"
        patched.append((name, None))
        setattr(Pool, name, lambda self, layer_id: None)
    try:
        outcomes, problems = gate_check.run_check()
    finally:
        for attr, value in patched:
            if value is None:
                delattr(Pool, attr)
            else:
                setattr(Pool, attr, value)
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        exit_code = gate_check.report(outcomes, problems)
    return {
        "scenario": scenario,
        "exit_code": exit_code,
        "summary": printed.getvalue().splitlines()[-1],
        "failed": [
            f"{o.getter} {o.variant} layer {o.layer}: {o.detail}" for o in outcomes if not o.ok
        ],
        "passed": sorted({o.getter for o in outcomes if o.ok}),
        "problems": problems,
    }


if __name__ == "__main__":
    for scenario in json.load(sys.stdin):
        print("RESULT " + json.dumps(run(scenario)), flush=True)
