"""Label and field selectors, matched in memory: what the caches answer a `list` with.

The reconciler reads through the same `get`/`list` signature whether it talks to the API
server or to the watch-fed caches, so a selector it sends must mean the same in both
places.  Only the forms the operator writes are understood (`k=v`, `k!=v`, `k in (a,b)`,
`k notin (a,b)`, `k`, `!k`; field selectors `a.b=v` and `a.b!=v`); anything else is an
error, not a silent mismatch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Match = Callable[[Mapping[str, str]], bool]


class SelectorError(ValueError):
    """A selector this module does not understand."""


@dataclass(frozen=True)
class Term:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: frozenset[str] = frozenset()

    def __call__(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        return present if self.op == "exists" else not present


def _split(selector: str) -> list[str]:
    """Comma-separated terms, commas inside `( )` kept."""
    terms, depth, start = [], 0, 0
    for i, char in enumerate(selector):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append(selector[start:i])
            start = i + 1
    terms.append(selector[start:])
    return [t.strip() for t in terms if t.strip()]


def _term(text: str) -> Term:
    for word in (" notin ", " in "):
        if word in text:
            key, rest = (part.strip() for part in text.split(word, 1))
            if not (rest.startswith("(") and rest.endswith(")")):
                raise SelectorError(f"selector term {text!r}: values must be in parentheses")
            values = frozenset(v.strip() for v in rest[1:-1].split(",") if v.strip())
            return Term(key, word.strip(), values)
    for op in ("!=", "=="):
        if op in text:
            key, value = (part.strip() for part in text.split(op, 1))
            return Term(key, "!=" if op == "!=" else "=", frozenset({value}))
    if "=" in text:
        key, value = (part.strip() for part in text.split("=", 1))
        return Term(key, "=", frozenset({value}))
    if text.startswith("!"):
        return Term(text[1:].strip(), "!exists")
    if any(c in text for c in " ()"):
        raise SelectorError(f"selector term {text!r} is not understood")
    return Term(text, "exists")


def parse(selector: str | None) -> tuple[Term, ...]:
    return tuple(_term(t) for t in _split(selector or ""))


def matches(terms: tuple[Term, ...], labels: Mapping[str, str]) -> bool:
    return all(term(labels) for term in terms)


def label_match(selector: str | None) -> Match:
    terms = parse(selector)
    return lambda labels: matches(terms, labels)


def flat_fields(obj: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """An object's scalar fields by dotted path (what a field selector names)."""
    out: dict[str, str] = {}
    for key, value in obj.items():
        if isinstance(value, Mapping):
            out.update(flat_fields(value, f"{prefix}{key}."))
        elif not isinstance(value, list):
            out[f"{prefix}{key}"] = str(value)
    return out


def field_match(selector: str | None) -> Callable[[Mapping[str, Any]], bool]:
    terms = parse(selector)
    if any(t.op not in ("=", "!=") for t in terms):
        raise SelectorError(f"field selector {selector!r}: only = and != are supported")
    if not terms:
        return lambda obj: True
    return lambda obj: matches(terms, flat_fields(obj))


def pinned(terms: tuple[Term, ...], key: str) -> frozenset[str] | None:
    """The values a selector allows for ``key`` (`key=v` or `key in (...)`), None when it
    does not pin the key: what lets a cache answer from an index instead of a scan."""
    found = [t.values for t in terms if t.key == key and t.op in ("=", "in")]
    return frozenset.intersection(*found) if found else None
