"""Reading a spec: a file or a table, validated with every sweep point, errors naming the file,
the key path and what was expected."""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path
from typing import Any

from pydantic import (
    ValidationError,
)

from tierscope.textfile import read_utf8

from .errors import SpecError, format_errors
from .expand import expand
from .filters import compile_filter
from .model import Point, Spec, Sweep
from .paths import flatten_matrix


def load_spec(path: str | Path) -> Spec:
    """Read and validate a spec file; every sweep point is validated. Raises SpecError."""

    path = Path(path)
    try:
        text = read_utf8(path, "a spec is TOML, which")
    except ValueError as err:
        raise SpecError(str(err)) from None
    return parse_spec(text, where=str(path), name=path.stem)


def parse_spec(text: str, where: str = "<spec>", name: str = "spec") -> Spec:
    """Validate a spec given as TOML text (`where` names it in errors)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise SpecError(f"{where}: not valid TOML: {err}") from err
    return spec_from_dict(raw, where=where, name=name)


def spec_from_dict(raw: dict[str, Any], where: str = "<spec>", name: str = "spec") -> Spec:
    raw = copy.deepcopy(raw)
    raw.setdefault("name", name)
    sweep_raw = raw.pop("sweep", {})
    if not isinstance(sweep_raw, dict):
        raise SpecError(f"{where}: sweep: expected a table ([sweep]), got {sweep_raw!r}")
    try:
        sweep = Sweep.model_validate(sweep_raw)
    except ValidationError as err:
        raise SpecError(format_errors(err, where, Sweep).replace(f"{where}: ", f"{where}: sweep.")) from err
    try:
        axes = flatten_matrix(sweep.matrix)
    except SpecError as err:
        raise SpecError(f"{where}: {err}") from None
    sweep = Sweep(matrix=axes, filters=sweep.filters, repeats=sweep.repeats)
    for i, expr in enumerate(sweep.filters):
        try:
            compile_filter(expr)
        except ValueError as err:
            raise SpecError(f"{where}: sweep.filters[{i}]: {err}") from None
    spec = Spec(name=str(raw["name"]), path=where, base=raw, sweep=sweep)
    points = expand(spec, where=where)  # validates every point
    if not points:
        raise SpecError(f"{where}: sweep.filters: no point is left after the filters")
    return spec


def points_of(path: str | Path) -> list[Point]:
    """Load a spec file and expand it."""
    return expand(load_spec(path))
