"""The engines' Prometheus pages as the probe reads them, through the router users run.

sglang-router 0.3.2 serves ``GET /engine_metrics``: every worker's /metrics on one page,
each sample labelled ``worker_addr="<worker URL>"``, and every ``:`` of a metric name (and
of help text) rewritten to ``_`` (``sglang:cached_tokens_total`` becomes
``sglang_cached_tokens_total``).  It parses each worker's page first and leaves out a page
it cannot parse, without saying so; the readers built on this module therefore require the
samples they rely on to be present, per worker (`kv_canary`, `dsv4_engine.probe.evidence`).
An engine's own /metrics page keeps the colons; names are compared in the router's
spelling (`spelled`), so one reader serves both pages.

Pure: imported by the probe and the operator, without torch or prometheus_client.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

WORKER_LABEL = "worker_addr"  # the engine a sample is from, as sglang-router labels it

_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def spelled(name: str) -> str:
    """A metric name as sglang-router 0.3.2's ``/engine_metrics`` serves it."""
    return name.replace(":", "_")


@dataclass(frozen=True)
class Sample:
    name: str
    """In the router's spelling (`spelled`)."""
    labels: dict[str, str] = field(hash=False)
    value: float

    @property
    def worker(self) -> str:
        return self.labels.get(WORKER_LABEL, "")


def samples(text: str) -> list[Sample]:
    """Every sample of a Prometheus text page (comments and blank lines skipped)."""
    out = []
    for line in text.splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        try:
            value = float(match["value"])
        except ValueError:
            continue
        labels = dict(_LABEL.findall(match["labels"] or ""))
        out.append(Sample(spelled(match["name"]), labels, value))
    return out


def named(page: list[Sample], metric: str) -> list[Sample]:
    """The samples of ``metric`` (either spelling)."""
    wanted = spelled(metric)
    return [s for s in page if s.name == wanted]


def workers(page: list[Sample]) -> set[str]:
    """Every worker a page has samples from ("" for an engine's own page)."""
    return {s.worker for s in page}


def labelled(text: str, worker: str) -> str:
    """``text`` as sglang-router serves a worker's page on ``/engine_metrics``: names in
    its spelling, each sample labelled with ``worker``.  (The reference router's page.)"""
    label = f'{WORKER_LABEL}="{worker}"'
    out = []
    for line in text.splitlines():
        if line.startswith("#"):
            out.append(spelled(line))
            continue
        match = _LINE.match(line)
        if match is None:
            out.append(line)
            continue
        labels = f"{match['labels']}," if match["labels"] else ""
        out.append(f"{spelled(match['name'])}{{{labels}{label}}} {match['value']}")
    return "".join(f"{line}\n" for line in out)
