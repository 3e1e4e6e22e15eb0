"""Known-bad combinations of the pinned engine: refused at admission unless acknowledged.

Why: upstream has reported spec/flag combinations that crash SGLang or corrupt DeepSeek-V4's
output on the version this project pins, and a canary is a poor place to learn it (an
engine that refuses to start is never probed; a loop that only shows at load passes a short
probe).  So the registry below lists them per pinned SGLang version, each with an id, one
line of why and its upstream link, and a deployment that matches one is refused — by the
API server at `kubectl apply` and by the operator's model alike — until its
`spec.acknowledgedKnownIssues` names the entry (an image carrying the fix, a test bed).

Each entry's predicate is written once, as a small tree of `Condition`s over the spec as
JSON (camelCase, defaults filled in: the very object the CRD's CEL rules see as `self`).
Both enforcement points are derived from that tree: `Condition.cel` gives the CRD's
`x-kubernetes-validations` rule (`rules`), `Condition.holds` the operator's check
(`refusal`), so the two cannot drift apart; tests/e2e/test_known_issues.py sends every
case of tests/data/known_issue_cases.yaml to the real API server and to the model and
requires the same verdict.  Arguments are matched as SGLang's argparse reads them: a
long option or any unambiguous abbreviation of it (`Flag.shortest`, checked against
SGLang's own parser in tests/unit/operator/test_op_known_issues.py), with its value after
`=` or as the next argument.  docs/known-issues.md is generated from `PINNED`
(hack/known_issues.py, `make manifests`).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dsv4_engine.engine_config import Backend
from dsv4_engine.features import IndexDtype, Role
from dsv4_engine.index_k import SGLANG_VERSION
from dsv4_operator.api.errors import FieldError
from dsv4_operator.api.schema import cel

Path = tuple[str, ...]  # camelCase field names from the spec's root
ACKNOWLEDGED = "acknowledgedKnownIssues"
ID_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# Joins a role's extraArgs for matching: an argument boundary (arguments with a newline
# inside are matched as if split there, by the CEL rule and the model alike).
_SEP = "\n"
_TOKEN = re.compile(r"^[-a-z0-9_]+$")  # flag names and values a rule may spell: no escaping


def _cel_path(path: Path) -> str:
    return "self." + ".".join(path)


def _cel_literal(value: str | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if not _TOKEN.match(value):
        raise ValueError(f"a condition's value must match {_TOKEN.pattern}: {value!r}")
    return f"'{value}'"


def _at(spec: Mapping[str, Any], path: Path) -> Any:
    node: Any = spec
    for key in path:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node


def _shown(path: Path) -> str:
    return "spec." + ".".join(path)


class Condition(ABC):
    """One part of an entry's predicate, in the two forms it is enforced in."""

    @abstractmethod
    def cel(self) -> str:
        """The CEL expression over `self` (the spec) that is true when the condition holds."""

    @abstractmethod
    def holds(self, spec: Mapping[str, Any]) -> bool:
        """The same test on the spec as JSON (camelCase, defaults filled in)."""

    @abstractmethod
    def describe(self) -> str:
        """The condition in words, naming the fields (the refusal and docs/known-issues.md)."""


@dataclass(frozen=True)
class Equals(Condition):
    """The field at `path` has `value`."""

    path: Path
    value: str | bool

    def cel(self) -> str:
        return f"{_cel_path(self.path)} == {_cel_literal(self.value)}"

    def holds(self, spec: Mapping[str, Any]) -> bool:
        return _at(spec, self.path) == self.value

    def describe(self) -> str:
        shown = str(self.value).lower() if isinstance(self.value, bool) else self.value
        return f"{_shown(self.path)} is {shown}"


@dataclass(frozen=True)
class Contains(Condition):
    """The list at `path` has `value` among its items."""

    path: Path
    value: str

    def cel(self) -> str:
        return f"{_cel_literal(self.value)} in {_cel_path(self.path)}"

    def holds(self, spec: Mapping[str, Any]) -> bool:
        return self.value in (_at(spec, self.path) or ())

    def describe(self) -> str:
        return f"{_shown(self.path)} lists {self.value}"


@dataclass(frozen=True)
class Flag:
    """A long option of SGLang's server and the shortest abbreviation argparse resolves
    to it (every longer prefix resolves to it too)."""

    name: str
    shortest: str

    def __post_init__(self) -> None:
        if not (self.name.startswith(self.shortest) and _TOKEN.match(self.name)):
            raise ValueError(f"{self.shortest!r} must abbreviate {self.name!r}")

    def regex(self) -> str:
        """Every spelling argparse reads as this flag: `--enable-det(e(r(…)?)?)?`."""
        tail = self.name[len(self.shortest) :]
        return self.shortest + "".join(f"({c}" for c in tail) + ")?" * len(tail)


@dataclass(frozen=True)
class SetsFlag(Condition):
    """The argument list at `path` sets one of `flags` — to one of `values`, if any given.

    One regular expression over the arguments joined by newlines decides it, evaluated by
    the API server (CEL `matches`, RE2) and by Python's `re` alike: it uses only syntax the
    two read the same way (groups, `?`, a negated class; no anchors, whose meaning at a
    trailing newline differs), and the joined text is framed by separators instead.
    """

    path: Path
    flags: tuple[Flag, ...]
    values: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for value in self.values:
            _cel_literal(value)

    def regex(self) -> str:
        names = "|".join(flag.regex() for flag in self.flags)
        if self.values:
            return rf"\n(?:{names})(?:=|\n)(?:{'|'.join(self.values)})\n"
        return rf"\n(?:{names})(?:=[^\n]*)?\n"

    def cel(self) -> str:
        pattern = self.regex().replace("\\", "\\\\")
        return f"('\\n' + {_cel_path(self.path)}.join('\\n') + '\\n').matches('{pattern}')"

    def holds(self, spec: Mapping[str, Any]) -> bool:
        args: Sequence[str] = _at(spec, self.path) or ()
        return re.search(self.regex(), _SEP + _SEP.join(args) + _SEP) is not None

    def describe(self) -> str:
        names = " or ".join(flag.name for flag in self.flags)
        to = f" to {' or '.join(self.values)}" if self.values else ""
        return f"{_shown(self.path)} sets {names}{to}"


@dataclass(frozen=True)
class All(Condition):
    """Every one of `conditions` holds."""

    conditions: tuple[Condition, ...]

    def cel(self) -> str:
        return " && ".join(f"({c.cel()})" for c in self.conditions)

    def holds(self, spec: Mapping[str, Any]) -> bool:
        return all(c.holds(spec) for c in self.conditions)

    def describe(self) -> str:
        return " and ".join(c.describe() for c in self.conditions)


@dataclass(frozen=True)
class Check:
    """One way a spec matches an entry, and the field the refusal names."""

    field: Path
    when: Condition


@dataclass(frozen=True)
class KnownIssue:
    """One known-bad combination: its id, why in one line, the upstream thread, and the
    checks that find it in a spec (any one matching refuses the spec)."""

    id: str
    why: str
    link: str
    checks: tuple[Check, ...]

    def __post_init__(self) -> None:
        if not re.match(ID_PATTERN, self.id):
            raise ValueError(f"a known-issue id must match {ID_PATTERN}: {self.id!r}")

    def message(self, check: Check) -> str:
        """The refusal, the same from the API server and the operator: the entry, its
        link, what in the spec matched, why, and how to acknowledge it."""
        return (
            f"known issue {self.id} of SGLang {SGLANG_VERSION} ({self.link}): "
            f"{check.when.describe()}: {self.why}; "
            f'to run it anyway, add "{self.id}" to spec.{ACKNOWLEDGED}'
        )


# Every entry is about SGLang: the CPU reference engine runs none of these flags.
ON_SGLANG = Equals(("engine",), Backend.SGLANG.value)


def _args(role: Role) -> Path:
    return (role.value, "extraArgs")


def _hicache_on(role: Role) -> Condition:
    return All(
        (
            Equals(("features", "hicache", "enabled"), True),
            Contains(("features", "hicache", "roles"), role.value),
        )
    )


def _per_role(when: Callable[[Role], Condition]) -> tuple[Check, ...]:
    """One check per engine role, reported at that role's extraArgs."""
    return tuple(Check(_args(role), when(role)) for role in Role)


# The pinned SGLang's entries; a new pin starts its own list (what still applies is re-read
# from upstream, not carried over).
KNOWN_ISSUES: dict[str, tuple[KnownIssue, ...]] = {
    "0.5.23": (
        KnownIssue(
            id="sglang-36174-deterministic-inference",
            why="SGLang refuses --enable-deterministic-inference for DeepSeek-V4 at startup "
            "(its model override pins the dsv4 attention backend, which deterministic "
            "inference does not allow), so the engine crash-loops; the fix, PR #37292, is "
            "open",
            link="https://github.com/sgl-project/sglang/issues/36174",
            # --rl-on-policy-target turns deterministic inference on (SGLang 0.5.23
            # arg_groups/attention_hook.handle_deterministic_inference): the same refusal.
            checks=_per_role(
                lambda role: SetsFlag(
                    _args(role),
                    (
                        Flag("--enable-deterministic-inference", "--enable-det"),
                        Flag("--rl-on-policy-target", "--rl-o"),
                    ),
                )
            ),
        ),
        KnownIssue(
            id="sglang-37838-trtllm-attention-pd",
            why="SGLang refuses the trtllm DeepSeek-V4 attention backend with P/D "
            "disaggregation at startup (every DSV4Deployment is disaggregated), so the engine "
            "crash-loops: its 512 B/token KV layout (FlashMLA's: 584) has not been run under "
            "P/D, where a handshake comparing only kv_cache_dtype let mixed pairs transfer an "
            "incompatible buffer",
            link="https://github.com/sgl-project/sglang/issues/37838",
            checks=_per_role(
                lambda role: SetsFlag(
                    _args(role), (Flag("--dsv4-attn-backend", "--dsv4-a"),), ("trtllm",)
                )
            ),
        ),
        KnownIssue(
            id="sglang-36179-hicache-l3-loops",
            why="with HiCache on DeepSeek-V4, generation loops: mean output length 600 "
            "tokens without HiCache, 1,100 with the host tier, 3,000+ with a Mooncake L3 "
            "storage backend (open)",
            link="https://github.com/sgl-project/sglang/issues/36179",
            checks=_per_role(
                lambda role: All(
                    (
                        _hicache_on(role),
                        SetsFlag(
                            _args(role),
                            (Flag("--hicache-storage-backend", "--hicache-storage-backend"),),
                        ),
                    )
                )
            ),
        ),
        KnownIssue(
            id="sglang-35811-hicache-fp4-indexer",
            why="HiCache on DeepSeek-V4-Flash with the fp4 indexer on B200 ended in an "
            "illegal memory access under a multi-turn benchmark (the report's command "
            "also ran DSpark speculative decoding; open)",
            link="https://github.com/sgl-project/sglang/issues/35811",
            checks=(
                Check(
                    ("features", "indexDtype"),
                    All(
                        (
                            Equals(("features", "hicache", "enabled"), True),
                            Equals(("features", "indexDtype"), IndexDtype.FP4.value),
                        )
                    ),
                ),
            ),
        ),
    )
}
PINNED: tuple[KnownIssue, ...] = KNOWN_ISSUES[SGLANG_VERSION]


def _guarded(check: Check) -> Condition:
    return All((ON_SGLANG, check.when))


def rules() -> list[dict[str, str]]:
    """The CRD's CEL rules: one per check of each pinned entry, at the check's field."""
    return [
        cel(
            f"'{issue.id}' in self.{ACKNOWLEDGED} || !({_guarded(check).cel()})",
            issue.message(check),
            "." + ".".join(check.field),
        )
        for issue in PINNED
        for check in issue.checks
    ]


def matches(spec: Mapping[str, Any]) -> list[tuple[KnownIssue, Check]]:
    """Every (entry, check) of the pinned entries the spec matches, acknowledged or not."""
    return [
        (issue, check) for issue in PINNED for check in issue.checks if _guarded(check).holds(spec)
    ]


def refusal(spec: Mapping[str, Any]) -> FieldError | None:
    """The first match the spec does not acknowledge, as the error the model raises."""
    acknowledged = set(spec.get(ACKNOWLEDGED) or ())
    refused = [(i, c) for i, c in matches(spec) if i.id not in acknowledged]
    if not refused:
        return None
    issue, check = refused[0]
    return FieldError(check.field, issue.message(check))
