"""How a spec error is told to a person: the field path first, as the API server says it."""

from __future__ import annotations

from pydantic import ValidationError


class FieldError(ValueError):
    """A model-wide rule's refusal that is about one field below the model (`path`,
    camelCase): `first_error` reports it at that field, where the API server's CEL rule
    (its `fieldPath`) reports the same refusal."""

    def __init__(self, path: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.path = path


def first_error(err: ValidationError, *path: str) -> str:
    """`spec.prefill.tp: tp must divide …`; ``path`` places a sub-model (e.g. "canary")."""
    first = err.errors()[0]
    cause = first.get("ctx", {}).get("error")
    below = cause.path if isinstance(cause, FieldError) else ()
    where = ".".join(str(p) for p in ("spec", *path, *first["loc"], *below))
    return f"{where}: {first['msg']}"
