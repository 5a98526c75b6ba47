"""Dotted key paths into a spec's table (`soft.db.cache`): get, set, and a sweep matrix flattened to
paths."""

from __future__ import annotations

from typing import Any

from .errors import SpecError


def set_path(tree: dict[str, Any], path: str, value: Any) -> None:
    keys = path.split(".")
    node = tree
    for k in keys[:-1]:
        nxt = node.get(k)
        if not isinstance(nxt, dict):
            nxt = {}
            node[k] = nxt
        node = nxt
    node[keys[-1]] = value


def get_path(tree: Any, path: str) -> Any:
    node = tree
    for k in path.split("."):
        if not isinstance(node, dict) or k not in node:
            raise KeyError(path)
        node = node[k]
    return node


def flatten_matrix(matrix: dict[str, Any], prefix: str = "") -> dict[str, list[Any]]:
    """Dotted key -> list of values; nested TOML tables (`workload.users = [...]`) are flattened."""
    out: dict[str, list[Any]] = {}
    for k, v in matrix.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten_matrix(v, key + "."))
        elif isinstance(v, list):
            if not v:
                raise SpecError(f"sweep.matrix.{key}: expected a non-empty list of values")
            out[key] = v
        else:
            raise SpecError(f"sweep.matrix.{key}: expected a list of values to sweep, got {v!r} (write [{v!r}])")
    return out
