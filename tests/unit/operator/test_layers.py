"""Dependencies point one way (docs/dsv4deployment.md, "Layers"), read from every import
statement of the code itself — in functions and `TYPE_CHECKING` blocks too.

A unit is a subpackage of `dsv4_operator` or one of its top-level modules.  Each may import
only the units `MAY_IMPORT` lists for it: the pure models and renderers at the bottom, the
Kubernetes client and caches above them, the rollout above that, the reconciler above the
rollout, and the process (`runtime`) and the `dsv4ctl` CLI on top, which nothing imports.
A new arrow is a decision to make here, not an accident of an import.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import get_type_hints

import pytest

from dsv4_operator.reconcile.state import PassState
from dsv4_operator.rollout.controller import PassView

ROOT = Path(__file__).resolve().parents[3]
OPERATOR = ROOT / "operator" / "dsv4_operator"
ENGINE = ROOT / "engine" / "dsv4_engine"

# The typed API, spec → objects (no I/O), the Prometheus registry, a pure helper.
PURE = {"api", "render", "metrics", "spread"}
MAY_IMPORT: dict[str, set[str]] = {
    "api": set(),
    "spread": set(),
    "metrics": {"api"},
    "render": {"api"},
    "kube": {"api", "render"},  # the client's resource table names LWS (render.lws)
    "rollout": PURE | {"kube"},
    "reconcile": PURE | {"kube", "rollout"},
    "leader": {"kube"},
    "runtime": PURE | {"kube", "rollout", "reconcile", "leader"},
    "cli": PURE | {"kube", "rollout", "reconcile"},
}


def unit_of(path: Path, package: Path = OPERATOR) -> str:
    rel = path.relative_to(package)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imported(path: Path, package: Path) -> Iterator[tuple[int, str]]:
    """(line, dotted name) of everything a module imports, relative imports resolved;
    `from a import b` yields `a.b` (b may be a module)."""
    here = [package.name, *path.relative_to(package).with_suffix("").parts]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"


def arrows(path: Path, package: Path) -> Iterator[tuple[int, str]]:
    """(line, unit) of each `dsv4_operator` unit ``path`` imports, other than its own."""
    own = unit_of(path, package)
    for line, name in imported(path, package):
        parts = name.split(".")
        if parts[0] == "dsv4_operator" and len(parts) > 1 and parts[1] != own:
            yield line, parts[1]


def violations(path: Path, package: Path = OPERATOR) -> list[str]:
    allowed = MAY_IMPORT[unit_of(path, package)]
    rel = path.relative_to(package.parent)
    found = {(line, unit) for line, unit in arrows(path, package) if unit not in allowed}
    return [f"{rel}:{line} imports {unit}" for line, unit in sorted(found)]


MODULES = sorted(OPERATOR.rglob("*.py"))


def test_every_unit_has_its_place():
    units = {unit_of(p) for p in MODULES} - {"__init__"}
    assert units == set(MAY_IMPORT), "place a new unit in MAY_IMPORT"


@pytest.mark.parametrize("unit", sorted(MAY_IMPORT))
def test_a_unit_imports_only_the_layers_below_it(unit):
    found = [v for p in MODULES if unit_of(p) == unit for v in violations(p)]
    assert not found, "\n".join(found)


def test_nothing_imports_the_cli_or_the_process():
    """`dsv4ctl` and `runtime` sit on top: what they hold that another unit needs belongs
    below them (the probe's arguments: `dsv4_engine.probe.args`)."""
    assert not [u for u, may in MAY_IMPORT.items() if may & {"cli", "runtime"}]


def test_the_infrastructure_is_below_both_reconcile_and_rollout():
    for unit in ("kube", "render", "api"):
        assert not MAY_IMPORT[unit] & {"reconcile", "rollout", "cli"}, unit
    assert not MAY_IMPORT["rollout"] & {"reconcile", "cli"}
    assert not MAY_IMPORT["render"] & {"kube"} and not MAY_IMPORT["api"] & {"kube"}


def test_a_forbidden_import_is_caught(tmp_path):
    """The walk sees absolute and relative forms, at module level and inside a function."""
    package = tmp_path / "dsv4_operator"
    rollout = package / "rollout"
    rollout.mkdir(parents=True)
    forms = {
        "absolute.py": "from dsv4_operator.reconcile.state import PassState\n",
        "package.py": "from dsv4_operator import cli\n",
        "relative.py": "from ..reconcile import state\n",
        "local.py": "def f():\n    import dsv4_operator.reconcile.state\n",
    }
    for name, source in forms.items():
        (rollout / name).write_text(source)
    for name in forms:
        assert violations(rollout / name, package), name
    (rollout / "allowed.py").write_text("from ..kube.cache import Reader\n")
    assert not violations(rollout / "allowed.py", package)


def test_the_reconcilers_pass_state_is_what_the_rollout_reads_of_a_pass():
    """`rollout` names what it reads of a pass as a Protocol instead of importing the
    reconciler's `PassState`: the state must keep providing each of it."""
    fields = {f.name for f in dataclasses.fields(PassState)}
    hints = get_type_hints(PassState)
    members = {n: m for n, m in vars(PassView).items() if isinstance(m, property)}
    assert members
    for name, member in members.items():
        assert name in fields, name
        assert get_type_hints(member.fget)["return"] == hints[name], name


def test_the_engine_imports_nothing_of_the_operator():
    found = [
        f"{p.relative_to(ROOT)}:{line} imports {name}"
        for p in sorted(ENGINE.rglob("*.py"))
        for line, name in imported(p, ENGINE)
        if name.split(".")[0] == "dsv4_operator"
    ]
    assert not found, "\n".join(found)
