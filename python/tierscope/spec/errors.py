"""The error every spec problem is reported as."""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ValidationError,
)


class SpecError(ValueError):
    """A spec that cannot be used; the message names the file, the key path and what was expected."""


# --- error messages ------------------------------------------------------------------------


def _loc_str(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and ("[" in part or part.startswith("function-") or part in ("list", "dict", "str")):
            continue  # pydantic's union / validator tags, not a key
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _model_at(model: type[BaseModel] | None, loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model class found by following the key path `loc` from `model` (None when unknown)."""
    import typing

    skip_key = False  # the next part is a key of a dict of models (e.g. a node type's letter)
    for part in loc:
        if isinstance(part, int):
            continue
        if skip_key:
            skip_key = False
            continue
        field = model.model_fields.get(part) if model is not None else None
        if field is None:
            return None
        models = _classes_in(field.annotation)
        model = models[0] if models else None
        skip_key = typing.get_origin(field.annotation) is dict
    return model


def _classes_in(ann: Any) -> list[type[BaseModel]]:
    """The pydantic model classes named in a type annotation (list[X], dict[str, X], X | None)."""
    out = []
    stack = [ann]
    while stack:
        a = stack.pop()
        if isinstance(a, type) and issubclass(a, BaseModel):
            out.append(a)
        stack.extend(getattr(a, "__args__", ()) or ())
    return out


def format_errors(err: ValidationError, where: str, root: type[BaseModel]) -> str:
    lines = []
    for e in err.errors():
        loc = e["loc"]
        path = _loc_str(loc)
        if e["type"] == "extra_forbidden":
            parent = _model_at(root, tuple(loc[:-1]))
            expected = (
                f" (expected one of: {', '.join(k for k, f in parent.model_fields.items() if not f.exclude)})"
                if parent is not None
                else ""
            )
            lines.append(f"{where}: {path}: unknown key{expected}")
        elif e["type"] == "missing":
            lines.append(f"{where}: {path}: missing required key")
        else:
            msg = e["msg"]
            msg = msg.removeprefix("Value error, ")
            got = e.get("input")
            suffix = ""
            if not isinstance(got, (dict, list)) and "got" not in msg and repr(got) not in msg:
                suffix = f" (got {got!r})"
            if not loc or path == "(top level)":
                lines.append(f"{where}: {msg}{suffix if loc else ''}")
            else:
                lines.append(f"{where}: {path}: {msg}{suffix}")
    return "\n".join(lines)
