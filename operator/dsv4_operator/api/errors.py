"""How a spec error is told to a person: the field path first, as the API server says it."""

from __future__ import annotations

from pydantic import ValidationError


def first_error(err: ValidationError, *path: str) -> str:
    """`spec.prefill.tp: tp must divide …`; ``path`` places a sub-model (e.g. "canary")."""
    first = err.errors()[0]
    where = ".".join(str(p) for p in ("spec", *path, *first["loc"]))
    return f"{where}: {first['msg']}"
