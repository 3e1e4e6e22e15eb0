"""The API access the operator's code makes, read from the code itself.

Every request of the operator goes through `Kube` (kube/client.py), so the permissions it
needs are the `kube.<method>(...)` calls in the modules the operator process runs, plus
the lists and watches of its informers (reconcile/watches.py: what the `cache.<method>`
reads are served from) and the watches kopf opens for its handlers.  This module finds those calls with `ast`,
resolves which kind each one addresses (a literal, a module constant, a loop over a
constant, a dict literal's "kind", a helper that returns one, or a plan Action whose kinds
are what the reconciler renders and lists) and turns them into RBAC (group, resource,
verb) triples.  A call it cannot resolve is an error that names the file and line, so new
API access cannot slip past the RBAC test unnoticed.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from dsv4_operator.api.samples import load_sample
from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.kube import client as kube_module
from dsv4_operator.reconcile.watches import CHILD_KINDS, WATCHES
from dsv4_operator.render import render_all
from dsv4_operator.render.meta import Owner
from dsv4_operator.render.router import ROUTER_CLUSTER_ROLE, ROUTER_RULES
from dsv4_operator.rollout.probe_job import PROBE_CLUSTER_ROLE, PROBE_RULES, probe_identity

PACKAGE = Path(inspect.getfile(kube_module)).parents[1]
# Not run by the installed operator: the CLI uses the user's own credentials.  (The local
# cluster tools, the local runtime and the development launcher are not in this package.)
NOT_THE_OPERATOR = ("cli",)
# The module whose requests stay in the operator's own namespace (a Role, not cluster-wide).
LEADER_ELECTION = "leader.py"
# The module that lists and watches what `WATCHES` names (its calls take the kind from it).
INFORMER = "informer.py"
SAMPLES = sorted((PACKAGE.parents[1] / "manifests" / "samples").glob("*-*.yaml"))

# What each `Kube` method sends, in RBAC verbs.  A server-side apply creates the object
# when it is missing, and the API server then checks `create` as well as `patch`.
KUBE_VERBS: dict[str, tuple[str, ...]] = {
    "get": ("get",),
    "list": ("list",),
    "snapshot": ("list",),
    "watch": ("watch",),
    "apply": ("create", "patch"),
    "create": ("create",),
    "replace": ("update",),
    "delete": ("delete",),
    "patch_merge": ("patch",),
    "patch_status": ("patch",),
    # The API's discovery document: a non-resource URL every authenticated client may read
    # (the built-in system:discovery binding), so no rule of the operator's grants it.
    "serves": (),
}
# Methods that address a subresource of the kind they are given.
SUBRESOURCE_OF = {"patch_status": "status"}
# `kube.request(...)` is the raw door: a call to it cannot be mapped to a permission here.
RAW = "request"
SENDERS = ("request", "_send")  # the private methods that put a request on the wire
# Methods whose first argument is a kind (the others take an object).
BY_KIND = ("get", "list", "snapshot", "watch", "delete", "patch_merge", "patch_status")


class UnresolvedAccess(AssertionError):
    pass


@dataclass(frozen=True)
class Access:
    scope: str  # "cluster" | "namespace" (the operator's own)
    group: str
    resource: str
    verb: str


def api_group(kind: str) -> tuple[str, str]:
    res = kube_module.RESOURCES[kind]
    group = "" if res.prefix == "/api/v1" else res.prefix.split("/")[2]
    return group, res.plural


def request_methods() -> set[str]:
    """Public `Kube` methods that send requests: they call a sender or such a method."""
    sources = {
        name: inspect.getsource(fn)
        for name, fn in inspect.getmembers(kube_module.Kube, inspect.isfunction)
    }
    sending = set(SENDERS)
    while True:
        more = {n for n, src in sources.items() if any(f"self.{s}(" in src for s in sending)}
        if more <= sending:
            break
        sending |= more
    return {name for name in sending if not name.startswith("_") and name != RAW}


def operator_modules() -> Iterator[tuple[Path, ModuleType]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in NOT_THE_OPERATOR:
            continue
        dotted = ".".join(("dsv4_operator", *rel.with_suffix("").parts))
        yield path, importlib.import_module(dotted.removesuffix(".__init__"))


def rendered_objects() -> list[dict[str, Any]]:
    """Everything the reconciler renders for the shipped samples (single- and multi-node)."""
    owner = Owner(name="x", namespace="ns", uid="00000000-0000-0000-0000-000000000000")
    samples = [load_sample(), *(yaml.safe_load(p.read_text()) for p in SAMPLES)]
    specs = [DSV4DeploymentSpec.model_validate(s["spec"]) for s in samples]
    assert any(s.decode.nodes_per_replica > 1 for s in specs), "no multi-node sample"
    return [o for spec in specs for o in render_all(owner, spec)]


def rendered_kinds() -> set[str]:
    """Kinds the reconciler applies."""
    return {o["kind"] for o in rendered_objects()}


# The ClusterRoles the install ships for the operator to bind, by name: their rules.
SHIPPED_CLUSTER_ROLES = {ROUTER_CLUSTER_ROLE: ROUTER_RULES, PROBE_CLUSTER_ROLE: PROBE_RULES}


def rendered_role_rules() -> list[dict[str, Any]]:
    """Rules the operator grants: of the shipped ClusterRoles its RoleBindings bind (the
    routers' and the probes'); it must hold them itself.  It creates no Role."""
    owner = Owner(name="x", namespace="ns", uid="00000000-0000-0000-0000-000000000000")
    objects = [*rendered_objects(), *probe_identity(owner)]
    bound = {o["roleRef"]["name"] for o in objects if o["kind"] == "RoleBinding"}
    return [r for name in sorted(bound) for r in SHIPPED_CLUSTER_ROLES[name]]


class _Resolver:
    """Resolves the kind(s) a `kube.<method>` call addresses, within one module."""

    def __init__(self, path: Path, module: ModuleType, tree: ast.Module) -> None:
        self.path = path
        self.module = module
        self.tree = tree
        self.parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}

    def fail(self, node: ast.AST, what: str) -> UnresolvedAccess:
        rel = self.path.relative_to(PACKAGE.parent) if PACKAGE in self.path.parents else self.path
        return UnresolvedAccess(
            f"{rel}:{node.lineno}: cannot tell {what} in `{ast.unparse(node)}`; "
            "teach tests/unit/install/rbac_from_code.py and grant it in manifests/base/rbac.yaml"
        )

    def constant(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name) and hasattr(self.module, node.id):
            return getattr(self.module, node.id)
        return None

    def loop_values(self, name: ast.Name) -> list[Any] | None:
        """Values of `name` when it is the target of a for/comprehension over a constant."""
        node: ast.AST | None = name
        while node is not None:
            node = self.parents.get(node)
            loops: list[ast.comprehension | ast.For] = []
            if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
                loops = list(node.generators)
            elif isinstance(node, ast.For):
                loops = [node]
            for loop in loops:
                values = self.constant(loop.iter)
                if values is None:
                    continue
                if isinstance(loop.target, ast.Name) and loop.target.id == name.id:
                    return list(values)
                if isinstance(loop.target, ast.Tuple):
                    ids = [t.id for t in loop.target.elts if isinstance(t, ast.Name)]
                    if name.id in ids:
                        return [v[ids.index(name.id)] for v in values]
        return None

    def names(self, node: ast.expr) -> list[Any]:
        """A string-valued argument: literal, module constant, or loop over a constant."""
        value = self.constant(node)
        if isinstance(value, str):
            return [value]
        if isinstance(node, ast.Name):
            looped = self.loop_values(node)
            if looped is not None:
                return looped
        raise self.fail(node, "which value")

    def enclosing_function(self, node: ast.AST) -> ast.FunctionDef | None:
        while node is not None and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node = self.parents.get(node)
        return node  # type: ignore[return-value]

    def assigned(self, name: ast.Name) -> ast.expr:
        function = self.enclosing_function(name)
        scope = function if function is not None else self.tree
        values = [
            a.value
            for a in ast.walk(scope)
            if isinstance(a, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name.id for t in a.targets)
        ]
        if len(values) != 1:
            raise self.fail(name, "what object the variable holds")
        return values[0]

    def loop_iterable(self, name: ast.Name) -> ast.expr | None:
        """What `name` iterates over when it is the target of an enclosing `for` loop."""
        node: ast.AST | None = self.parents.get(name)
        while node is not None:
            if (
                isinstance(node, ast.For)
                and isinstance(node.target, ast.Name)
                and node.target.id == name.id
            ):
                return node.iter
            node = self.parents.get(node)
        return None

    def object_kinds(self, node: ast.expr) -> set[str]:
        """Kinds of an object argument (create/apply/replace)."""
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "kind":
                    return set(self.names(value))
        if isinstance(node, (ast.List, ast.Tuple)) and node.elts:
            # A helper returning several objects (e.g. a ServiceAccount and its RoleBinding).
            return set().union(*(self.object_kinds(element) for element in node.elts))
        if isinstance(node, ast.Starred):  # `[*helper(...), obj]`: what the helper returns
            return self.object_kinds(node.value)
        if isinstance(node, ast.Name):
            iterable = self.loop_iterable(node)
            if iterable is not None:  # `for obj in helper(...)`: the objects it returns
                return self.object_kinds(iterable)
            return self.object_kinds(self.assigned(node))
        if isinstance(node, ast.Call):
            if _is_kube_call(node, "get"):
                return set(self.names(node.args[0]))
            if isinstance(node.func, ast.Name):
                return self.returned_kinds(node.func.id, node)
        if isinstance(node, ast.Attribute) and node.attr == "obj":
            return rendered_kinds()  # a plan Action: the objects render_all produced
        raise self.fail(node, "which kind the object is")

    def returned_kinds(self, function: str, call: ast.Call) -> set[str]:
        """Kinds of the dict literals a helper returns, following an import if needed."""
        imported = getattr(self.module, function, None)
        if inspect.isfunction(imported) and imported.__module__ != self.module.__name__:
            module = importlib.import_module(imported.__module__)
            path = Path(inspect.getfile(module))
            home = _Resolver(path, module, ast.parse(path.read_text()))
            return home.returned_kinds(imported.__name__, call)
        defs = [d for d in self.tree.body if isinstance(d, ast.FunctionDef) and d.name == function]
        if not defs:
            raise self.fail(call, f"what {function}() returns")
        returns = [
            r.value
            for r in ast.walk(defs[0])
            if isinstance(r, ast.Return)
            and r.value
            and self.enclosing_function(r) is defs[0]  # not a nested helper's returns
        ]
        return set().union(*(self.object_kinds(r) for r in returns))

    def callback_kinds(self, ref: ast.Attribute) -> set[str]:
        """Kinds reached through `kube.<method>` handed to a class or function as a value:
        the calls of that parameter inside it (e.g. ProbeExecutor(kube.apply, ...) then
        `self._apply(report_config_map(...))`)."""
        call = self.parents.get(ref)
        if isinstance(call, ast.keyword):
            call = self.parents.get(call)
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
            raise self.fail(ref, "where this Kube method is handed to")
        target = getattr(self.module, call.func.id, None)
        is_class = inspect.isclass(target)
        function = target.__init__ if is_class else target
        if not inspect.isfunction(function):
            raise self.fail(ref, f"what {call.func.id} is")
        params = list(inspect.signature(function).parameters)[1 if is_class else 0 :]
        keyword = [k.arg for k in call.keywords if k.value is ref]
        param = keyword[0] if keyword else params[call.args.index(ref)]
        module = importlib.import_module(target.__module__)
        path = Path(inspect.getfile(module))
        home = _Resolver(path, module, ast.parse(path.read_text()))
        (body,) = [d for d in home.tree.body if getattr(d, "name", None) == target.__name__]
        callee = param
        if is_class:  # the parameter is stored as `self.<attr> = <param>` in __init__
            callee = next(
                f"self.{a.targets[0].attr}"
                for a in ast.walk(body)
                if isinstance(a, ast.Assign)
                and isinstance(a.targets[0], ast.Attribute)
                and isinstance(a.value, ast.Name)
                and a.value.id == param
            )
        uses = [
            a for c in ast.walk(body) if isinstance(c, ast.Call) for a in _first_argument(c, callee)
        ]
        if not uses:
            raise self.fail(ref, f"how {target.__name__} uses {param}")
        method = ref.attr
        resolve = home.kind_argument if method in BY_KIND else home.object_kinds
        return set().union(*(resolve(argument) for argument in uses))

    def kind_argument(self, node: ast.expr) -> set[str]:
        """Kinds of a kind argument (get/list/delete)."""
        if _names_kind(node):
            # `action.kind` / `obj["kind"]`: a plan Action or a listed object; the operator
            # only deletes children it listed by its instance selector among CHILD_KINDS.
            return set(CHILD_KINDS)
        return set(self.names(node))


def _first_argument(call: ast.Call, callee: str) -> list[ast.expr]:
    """The first argument `callee` gets in `call`: `callee(x)` or `asyncio.to_thread(callee, x)`."""
    if ast.unparse(call.func) == callee and call.args:
        return [call.args[0]]
    if ast.unparse(call.func).endswith("to_thread") and len(call.args) > 1:
        if ast.unparse(call.args[0]) == callee:
            return [call.args[1]]
    return []


def _names_kind(node: ast.expr) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr == "kind"
    return (
        isinstance(node, ast.Subscript)
        and isinstance(node.slice, ast.Constant)
        and node.slice.value == "kind"
    )


def _is_kube_reference(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """`kube.<method>` used as a value (handed on), not called here."""
    if not (isinstance(node, ast.Attribute) and node.attr in KUBE_VERBS):
        return False
    if ast.unparse(node.value).split(".")[-1] != "kube":
        return False
    parent = parents.get(node)
    return not (isinstance(parent, ast.Call) and parent.func is node)


def _is_kube_call(node: ast.AST, method: str | None = None) -> bool:
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return False
    receiver = ast.unparse(node.func.value).split(".")[-1]
    known = (*KUBE_VERBS, RAW)
    return receiver == "kube" and node.func.attr in ((method,) if method else known)


def informer_watches() -> Iterator[Access]:
    """Each informer lists and watches its kind (every namespace, or the operator's)."""
    for watch in WATCHES:
        group, plural = api_group(watch.kind)
        for verb in ("list", "watch"):
            yield Access("cluster", group, plural, verb)


def kube_calls() -> Iterator[Access]:
    for path, module in operator_modules():
        if path.name == INFORMER:
            continue  # its kinds are WATCHES' (informer_watches)
        tree = ast.parse(path.read_text())
        resolver = _Resolver(path, module, tree)
        scope = "namespace" if path.name == LEADER_ELECTION else "cluster"
        for node in ast.walk(tree):
            if _is_kube_reference(node, resolver.parents):
                assert isinstance(node, ast.Attribute)
                if not KUBE_VERBS[node.attr]:
                    continue  # no permission to account for (discovery)
                for kind in resolver.callback_kinds(node):
                    group, plural = api_group(kind)
                    for verb in KUBE_VERBS[node.attr]:
                        yield Access(scope, group, plural, verb)
                continue
            if not _is_kube_call(node):
                continue
            assert isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            method = node.func.attr
            if method != RAW and not KUBE_VERBS[method]:
                continue  # no permission to account for (discovery)
            if method == RAW:
                raise resolver.fail(node, "what a raw kube.request() needs")
            subresource = SUBRESOURCE_OF.get(method)
            if method in BY_KIND:
                kinds = resolver.kind_argument(node.args[0])
            else:
                kinds = resolver.object_kinds(node.args[0])
            verbs = KUBE_VERBS[method]
            for kind in kinds:
                group, plural = api_group(kind)
                resource = f"{plural}/{subresource}" if subresource else plural
                for verb in verbs:
                    yield Access(scope, group, resource, verb)


def kopf_watches() -> Iterator[Access]:
    """kopf lists and watches what each `kopf.on.event(group, version, plural)` names."""
    for path, module in operator_modules():
        tree = ast.parse(path.read_text())
        resolver = _Resolver(path, module, tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and ast.unparse(node.func) == "kopf.on.event"
                and len(node.args) >= 3
            ):
                groups = resolver.names(node.args[0])
                plurals = resolver.names(node.args[2])
                for group, plural in zip(groups, plurals, strict=True):
                    for verb in ("list", "watch"):
                        yield Access("cluster", group, plural, verb)


def kopf_scanning() -> Iterator[Access]:
    """Unless runtime.py disables kopf's scanning, kopf lists and watches CRDs (to serve a
    resource whose CRD appears after start); cluster-wide it watches no namespaces."""
    source = (PACKAGE / "runtime.py").read_text()
    if "scanning.disabled = True" not in source:
        for verb in ("list", "watch"):
            yield Access("cluster", "apiextensions.k8s.io", "customresourcedefinitions", verb)


def escalation() -> Iterator[Access]:
    """What the operator grants (the shipped ClusterRoles it binds), it must hold: RBAC
    escalation prevention."""
    for rule in rendered_role_rules():
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    yield Access("cluster", group, resource, verb)


def needed() -> set[Access]:
    return {*kube_calls(), *informer_watches(), *kopf_watches(), *kopf_scanning(), *escalation()}


def granted(rules: Iterable[dict[str, Any]], scope: str) -> set[Access]:
    return {
        Access(scope, group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
