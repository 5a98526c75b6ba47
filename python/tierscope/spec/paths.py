"""Dotted key paths into a spec's table (`soft.db.cache`; when setting, a number picks an element of
an array of tables: `interference.noisy_neighbour.0.burstiness`): get, set, and a sweep matrix
flattened to paths."""

from __future__ import annotations

from typing import Any

from .errors import SpecError


def set_path(tree: dict[str, Any], path: str, value: Any) -> None:
    """Set `path` in `tree`, making the tables it names; a number picks an element of an array of
    tables (`interference.noisy_neighbour.0.burstiness`), which must exist."""
    keys = path.split(".")
    node: Any = tree
    for i, k in enumerate(keys[:-1]):
        if isinstance(node, list):
            node = _element(node, k, keys[:i])
            continue
        nxt = node.get(k)
        if not isinstance(nxt, dict | list):
            nxt = {}
            node[k] = nxt
        node = nxt
    if isinstance(node, list):
        node[_index(node, keys[-1], keys[:-1])] = value
    else:
        node[keys[-1]] = value


def get_path(tree: Any, path: str) -> Any:
    node = tree
    for k in path.split("."):
        if not isinstance(node, dict) or k not in node:
            raise KeyError(path)
        node = node[k]
    return node


def _index(items: list[Any], key: str, where: list[str]) -> int:
    if not key.isdigit() or int(key) >= len(items):
        raise SpecError(
            f"{'.'.join(where)}: an array of {len(items)} table(s): expected an index 0..{len(items) - 1} "
            f"after it, got {key!r}"
        )
    return int(key)


def _element(items: list[Any], key: str, where: list[str]) -> Any:
    node = items[_index(items, key, where)]
    if not isinstance(node, dict):
        raise SpecError(f"{'.'.join(where)}.{key}: expected a table, got {node!r}")
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
