"""A run config's validation error as one line: the first problem, naming the key and what is allowed."""

from __future__ import annotations

import difflib
from typing import Any, get_args

from pydantic import BaseModel, ValidationError


def _where(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "run config"


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models inside a field's type: X, X | None, tuple[X, ...], dict[str, X]."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def _section(root: type[BaseModel], path: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model at `path` in a run config (list indexes and dict keys step into the item's model)."""
    model: type[BaseModel] | None = root
    for part in path:
        if model is None:
            return None
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is not None:
            found = _models_in(field.annotation)
            model = found[0] if found else None
    return model


def one_line(exc: ValidationError, root: type[BaseModel]) -> str:
    """The first problem, naming the key: what is wrong and what is allowed. An unknown key goes first: a
    misspelt required key is also a missing one, and the misspelling is what the user has to see."""
    errors = exc.errors()
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc, kind = tuple(err["loc"]), err["type"]
    if kind == "extra_forbidden":
        parent = loc[:-1]
        model = _section(root, parent)
        allowed = f"; allowed: {', '.join(model.model_fields)}" if model is not None else ""
        close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields) if model else [], n=1)
        meant = f" (did you mean {close[0]!r}?)" if close else ""
        return f"unknown key {str(loc[-1])!r} in {_where(parent)}{meant}{allowed}"
    if kind == "missing":
        return f"missing key {str(loc[-1])!r} in {_where(loc[:-1])}"
    msg = str(err["msg"]).removeprefix("Value error, ")
    if kind == "string_pattern_mismatch" and loc[:1] == ("secrets",):
        msg = "must be an environment variable NAME (A-Z, 0-9, _); the value comes from your environment"
    if not loc:
        return msg
    got = err.get("input")
    shown = "" if isinstance(got, dict | list) or kind.startswith("value_error") else f" (got {got!r})"
    return f"{_where(loc)}: {msg}{shown}"
