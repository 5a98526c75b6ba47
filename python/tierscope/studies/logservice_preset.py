"""A log-service experiment file (presets/ingest.toml): the modes to compare, the offered load
(the driver's `Load`) and the service (the experiment's `Service`), checked with the file, key
and what was expected on error."""

from __future__ import annotations

import tomllib
from dataclasses import fields
from pathlib import Path

from tierscope.apps.logservice.app import MODES
from tierscope.apps.logservice.driver import Load
from tierscope.studies.logservice import Service


class PresetError(ValueError):
    pass


def _build(cls, raw: object, where: str):
    if not isinstance(raw, dict):
        raise PresetError(f"{where}: expected a table, got {raw!r}")
    known = {f.name: f for f in fields(cls)}
    kw = {}
    for key, value in raw.items():
        if key not in known:
            raise PresetError(f"{where}.{key}: unknown key (expected one of: {', '.join(known)})")
        default = known[key].default
        kind = float if isinstance(default, float) or default is None else type(default)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise PresetError(f"{where}.{key}: expected {kind.__name__}, got {value!r}")
        kw[key] = value
    try:
        return cls(**kw)
    except ValueError as err:
        raise PresetError(f"{where}: {err}") from None


def load_preset(path: Path) -> tuple[list[str], Load, Service, str]:
    """(modes, load, service, description) of an ingest preset; PresetError names what is wrong."""
    try:
        raw = tomllib.loads(Path(path).read_bytes().decode("utf-8"))
    except OSError as err:
        raise PresetError(f"{path}: cannot read: {err.strerror or err}") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise PresetError(f"{path}: not valid TOML: {err}") from None
    unknown = set(raw) - {"description", "modes", "load", "service"}
    if unknown:
        raise PresetError(f"{path}: {sorted(unknown)[0]}: unknown key (expected description, modes, load, service)")
    modes = raw.get("modes", list(MODES))
    if not isinstance(modes, list) or not modes or any(m not in MODES for m in modes):
        raise PresetError(f"{path}: modes: expected a list of {', '.join(MODES)}, got {modes!r}")
    load = _build(Load, raw.get("load", {}), f"{path}: load")
    service = _build(Service, raw.get("service", {}), f"{path}: service")
    return modes, load, service, str(raw.get("description", ""))
