"""Runs the SGLang gate check (dsv4_engine.sglang_plugin.gate_check) on the real pool as
pinned, then with SGLang broken one way at a time; one JSON line per scenario.

Run as a script in its own process (SGLang keeps process-wide context).  Each broken
scenario patches SGLang for its run only:

- ``no-wait:<getter>``: the getter runs with the pool's layer counter hidden, i.e. its
  ``wait_layer_transfer`` patched out (the seed fork's bug);
- ``next-layer:<getter>``: the getter first waits for the layer after its own;
- ``new-getter``: the pool grows a ``get_*`` method the check does not classify;
- ``edit:<mutant>[+<mutant>…]``: SGLang functions recompiled from their own source with
  one edit each (``SOURCE_MUTANTS``), e.g. a counter registration deleted.
"""

from __future__ import annotations
import __future__

import ast
import contextlib
import inspect
import io
import json
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sglang.srt.managers.cache_controller import HiCacheController, LayerDoneCounter
from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool as Pool
from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController

from dsv4_engine.sglang_plugin import gate_check


@dataclass(frozen=True)
class SourceMutant:
    """`owner.name` (a function of SGLang's) with the text `old` in its source made `new`."""

    owner: Any  # a class or a module
    name: str
    old: str
    new: str


SOURCE_MUTANTS = {
    # Each getter's wait ignores the pipeline stage's first layer.
    "no-offset": SourceMutant(
        Pool, "wait_layer_transfer", "wait_until(layer_id - self.start_layer)", "wait_until(layer_id)"
    ),
    # SGLang's counter lets a read through once the layer before it has loaded.
    "counter-off-by-one": SourceMutant(
        LayerDoneCounter,
        "wait_until",
        ".wait(threshold)",
        ".wait(threshold - 1)",
    ),
    # The assembly's registration of the controller's counter with the DeepSeek-V4 pool.
    "unregistered-assembler": SourceMutant(
        hybrid_pool_assembler,
        "_apply_stack_result",
        "kvcache.register_layer_transfer_counter(result.cache_controller.layer_done_counter)",
        "pass",
    ),
    # The cache controller's own registration of its first counter with the device pool.
    "unregistered-controller": SourceMutant(
        HiCacheController,
        "__init__",
        "self.mem_pool_device.register_layer_transfer_counter(self.layer_done_counter)",
        "pass",
    ),
    # The hybrid controller replaces that first counter by its own, as it does when its
    # transfer layer count differs from the pool's: then only the assembly's registration
    # gives the pool the counter loads record into.
    "fresh-counter": SourceMutant(
        HybridCacheController,
        "__init__",
        "and transfer_layer_id_max != self.transfer_layer_id_max",
        "",
    ),
}  # fmt: skip


def recompiled(mutant: SourceMutant) -> Callable[..., Any]:
    """The mutant's function compiled again from SGLang's source with the edit, in its
    module's globals, line numbers kept (tracebacks point into SGLang).  A method is
    compiled in a class of its owner's name, so private names mangle as SGLang's do, and
    its ``super()`` cell is pointed at the owner."""
    function = vars(mutant.owner)[mutant.name]
    lines, first_line = inspect.getsourcelines(function)
    source = textwrap.dedent("".join(lines))
    if source.count(mutant.old) != 1:
        raise AssertionError(f"{function.__qualname__}: expected {mutant.old!r} once")
    source = source.replace(mutant.old, mutant.new)
    method = isinstance(mutant.owner, type)
    if method:
        source = f"class {mutant.owner.__name__}:\n" + textwrap.indent(source, "    ")
    tree = ast.parse(source)
    ast.increment_lineno(tree, first_line - 1 - method)
    code = compile(
        tree,
        inspect.getsourcefile(function) or "<sglang>",
        "exec",
        flags=__future__.annotations.compiler_flag,  # SGLang's modules defer annotations
        dont_inherit=True,
    )
    namespace: dict[str, Any] = {}
    exec(code, function.__globals__, namespace)
    edited = (
        vars(namespace[mutant.owner.__name__])[mutant.name] if method else namespace[mutant.name]
    )
    for name, cell in zip(edited.__code__.co_freevars, edited.__closure__ or (), strict=True):
        if name == "__class__":
            cell.cell_contents = mutant.owner
    return edited


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


def patches(scenario: str) -> list[tuple[Any, str, Any]]:
    """(owner, attribute, replacement) for each change a scenario makes to SGLang."""
    kind, _, name = scenario.partition(":")
    if kind in ("no-wait", "next-layer"):
        patch = without_wait if kind == "no-wait" else waiting_for_next_layer
        return [(Pool, name, patch(vars(Pool)[name]))]
    if kind == "new-getter":
        return [(Pool, "get_new_buffer", lambda self, layer_id: None)]
    if kind == "edit":
        return [
            (m.owner, m.name, recompiled(m)) for m in (SOURCE_MUTANTS[n] for n in name.split("+"))
        ]
    return []


@contextlib.contextmanager
def patched(changes: list[tuple[Any, str, Any]]) -> Iterator[None]:
    """Apply the changes for the duration of the block, then put SGLang back as it was."""
    saved = [(owner, attr, vars(owner).get(attr)) for owner, attr, _ in changes]
    for owner, attr, value in changes:
        setattr(owner, attr, value)
    try:
        yield
    finally:
        for owner, attr, value in saved:
            if value is None:
                delattr(owner, attr)
            else:
                setattr(owner, attr, value)


def run(scenario: str) -> dict[str, Any]:
    with patched(patches(scenario)):
        outcomes, problems = gate_check.run_check()
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        exit_code = gate_check.report(outcomes, problems)
    return {
        "scenario": scenario,
        "exit_code": exit_code,
        "summary": printed.getvalue().splitlines()[-1],
        "failed": [
            f"{o.getter} {o.variant} {o.stage}, layer {o.layer}: {o.detail}"
            for o in outcomes
            if not o.ok
        ],
        "passed": sorted({o.getter for o in outcomes if o.ok}),
        "calls": len(outcomes),
        "problems": problems,
    }


if __name__ == "__main__":
    for scenario in json.load(sys.stdin):
        print("RESULT " + json.dumps(run(scenario)), flush=True)
