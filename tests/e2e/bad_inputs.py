"""Mutated DSV4Deployments for the bad-input sweep (Hypothesis strategies, pure).

A case is a shipped sample with one to three mutations, each of a class a user's typo or
misunderstanding produces: a field out of its range, of the wrong type, an enum value that
does not exist, an absurd resource size, a GPU product no node has, a name that is too long
or not a DNS label, parallelism that does not add up, a field that does not exist.  Which
fields: every leaf of the CRD's own schema (so a field added to the API is swept too), plus
the targeted classes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import yaml
from hypothesis import strategies as st

from dsv4_operator.api.crd import CRD_PATH
from dsv4_operator.api.names import MULTINODE_MAX, SINGLE_NODE_MAX
from dsv4_operator.api.samples import load_sample, shipped_sample

Path = tuple[str | int, ...]
BASES = {
    "b200-1p1d": load_sample(),
    "flash-reference": shipped_sample("flash-reference"),
    "flash-b200-1p1d": shipped_sample("flash-b200-1p1d"),
    "pro-gb200-nvl72": shipped_sample("pro-gb200-nvl72"),
}
QUANTITY_FIELDS = ("cpu", "memory", "hugepages1Gi")
ABSURD_SIZES = ["3Ti", "999Pi", "1e3", "-5Gi", "0", "0.0001m", "abc", "1Ei", "12 Gi", "", "5"]
PRODUCTS = ["NVIDIA-H100", "nvidia-b200", "NVIDIA-B200 ", "", "B200", "NVIDIA-GB300"]
NAME_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789-.A"


@dataclass(frozen=True)
class Leaf:
    path: Path
    schema: dict[str, Any]


def _walk(node: dict[str, Any], path: Path) -> list[Leaf]:
    out = [Leaf(path, node)]
    for key, child in (node.get("properties") or {}).items():
        out += _walk(child, (*path, key))
    if node.get("type") == "array":
        out += _walk(node["items"], (*path, 0))
    return out


def spec_leaves() -> list[Leaf]:
    crd = yaml.safe_load(CRD_PATH.read_text())
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return _walk(root, ("spec",))[1:]  # every field under spec, objects and lists included


def put(obj: dict[str, Any], path: Path, value: Any) -> None:
    """Set ``path`` in ``obj``, making the objects and one-element lists on the way."""
    node: Any = obj
    for key, nxt in zip(path, path[1:], strict=False):
        empty: Any = [] if isinstance(nxt, int) else {}
        if isinstance(key, int):
            if not node:
                node.append(empty)
            node = node[0]
        else:
            if not isinstance(node.get(key), type(empty)):
                node[key] = empty
            node = node[key]
    last = path[-1]
    if isinstance(last, int):
        node[:] = [value]
    else:
        node[last] = value


def _out_of_range(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    kind = schema.get("type")
    if kind in ("integer", "number"):
        edges = [-1, 0, -(10**6), 10**12]
        if "minimum" in schema:
            edges.append(schema["minimum"] - 1)
        if "maximum" in schema:
            edges.append(schema["maximum"] + 1)
        values = st.sampled_from(edges)
        return (
            values if kind == "integer" else st.one_of(values, st.sampled_from([0.5, 1.0, 1e300]))
        )
    if kind == "string":
        longest = schema.get("maxLength", 64)
        return st.sampled_from(["", "x" * (longest + 1)])
    if kind == "array":
        return st.sampled_from([[], ["x"] * (schema.get("maxItems", 16) + 1)])
    return st.just({})


_WRONG_TYPE = {
    "integer": ["3", 1.5, True, [], {}, None],
    "number": ["2.0", True, [], {}],
    "string": [5, 1.5, True, [], {"a": 1}],
    "boolean": ["yes", 1, [], {}],
    "array": ["x", 5, {"a": 1}],
    "object": ["x", 5, [1]],
}


def _edge(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """A value the schema allows but a user would not expect to work: its bounds, an odd
    member, any text (label keys, env names, paths the schema does not constrain)."""
    kind = schema.get("type")
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if kind in ("integer", "number"):
        low, high = schema.get("minimum", -(10**6)), schema.get("maximum", 10**9)
        ints = st.integers(int(low) + (1 if schema.get("exclusiveMinimum") else 0), int(high))
        edges = st.sampled_from([v for v in (low, high, 1e300) if kind == "number" or v != 1e300])
        return ints if kind == "integer" else st.one_of(ints.map(float), edges)
    if kind == "boolean":
        return st.booleans()
    if kind == "string":
        longest = min(schema.get("maxLength", 64), 64)
        return st.text(st.characters(blacklist_characters="\x00"), max_size=longest)
    if kind == "object" and not schema.get("properties"):
        key = st.text("abcxyz/.-_ AZ09", min_size=1, max_size=12)
        return st.dictionaries(key, st.text("abc -_.", max_size=8), max_size=2)
    return st.just([]) if kind == "array" else st.just({})


def _garbage(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    if schema.get("type") != "string":
        return _out_of_range(schema)
    text = st.text(st.characters(blacklist_characters="\x00"), max_size=40)
    return st.one_of(text, st.sampled_from(["fp16", "on", "v5", "None", "--tp-size=8", "a b"]))


@dataclass(frozen=True)
class Case:
    classes: tuple[str, ...]
    base: str
    obj: dict[str, Any]


@st.composite
def mutation(draw: st.DrawFn, obj: dict[str, Any], leaves: list[Leaf]) -> str:
    """Mutate ``obj`` in place; returns the class of the mutation."""
    cls = draw(
        st.sampled_from(
            [
                "out_of_range", "wrong_type", "garbage", "edge_value", "absurd_size",
                "unknown_product",
                "long_name", "conflicting_parallelism", "unknown_field",
            ]
        )
    )  # fmt: skip
    spec = obj["spec"]
    role = draw(st.sampled_from(["prefill", "decode"]))
    if cls in ("out_of_range", "wrong_type", "garbage", "edge_value"):
        leaf = draw(st.sampled_from(leaves))
        if cls == "wrong_type":
            value = draw(st.sampled_from(_WRONG_TYPE[leaf.schema.get("type", "object")]))
        elif cls == "out_of_range":
            value = draw(_out_of_range(leaf.schema))
        elif cls == "edge_value":
            value = draw(_edge(leaf.schema))
        else:
            value = draw(_garbage(leaf.schema))
        put(obj, leaf.path, value)
    elif cls == "absurd_size":
        field = draw(st.sampled_from(QUANTITY_FIELDS))
        put(obj, ("spec", role, "resources", field), draw(st.sampled_from(ABSURD_SIZES)))
    elif cls == "unknown_product":
        products = draw(st.lists(st.sampled_from(PRODUCTS), min_size=1, max_size=3))
        put(obj, ("spec", "placement", "gpuProducts"), products)
    elif cls == "long_name":
        near = draw(st.sampled_from([SINGLE_NODE_MAX, MULTINODE_MAX])) + draw(st.integers(-1, 2))
        length = draw(st.one_of(st.just(near), st.integers(1, 80)))
        name = draw(st.text(NAME_CHARS, min_size=length, max_size=length))
        obj["metadata"]["name"] = draw(st.sampled_from([name, "n" + "x" * (length - 1)]))
    elif cls == "conflicting_parallelism":
        small = st.integers(1, 16)
        if not isinstance(spec.get(role), dict):  # an earlier mutation replaced the section
            spec[role] = {}
        section = spec[role]
        for field in ("tp", "dp", "ep", "gpusPerNode", "nodesPerReplica"):
            if draw(st.booleans()):
                section[field] = draw(small)
        section["enableDpAttention"] = draw(st.booleans())
    else:
        where = draw(st.sampled_from([("spec",), ("spec", role), ("spec", "features")]))
        key = draw(st.sampled_from(["foo", "replica", "tensorParallel", "hicacheRatio", "Tp"]))
        put(obj, (*where, key), 1)
    return cls


@st.composite
def cases(draw: st.DrawFn, leaves: list[Leaf]) -> Case:
    base = draw(st.sampled_from(sorted(BASES)))
    obj = copy.deepcopy(BASES[base])
    obj["metadata"] = {"name": "sweep"}
    classes = tuple(draw(mutation(obj, leaves)) for _ in range(draw(st.integers(1, 3))))
    return Case(classes, base, obj)


def pods_wanted(spec: dict[str, Any]) -> int:
    """Pods a (server-accepted) spec makes: what real applies are budgeted by."""
    total = int((spec.get("router") or {}).get("replicas", 1))
    for role in ("prefill", "decode"):
        section = spec.get(role) or {}
        total += int(section.get("replicas", 1)) * int(section.get("nodesPerReplica", 1))
    return total
