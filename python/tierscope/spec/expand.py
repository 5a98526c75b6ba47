"""Expansion: a spec's sweep as the list of points the runner executes, each a fully resolved
configuration with a stable id."""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import re
from typing import Any

from pydantic import (
    ValidationError,
)

from tierscope.tiers import TIERS

from .errors import SpecError, format_errors
from .filters import compile_filter, eval_filter
from .model import Point, PointConfig, Spec
from .paths import set_path

# --- expansion ---------------------------------------------------------------------------------


def _slug(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return re.sub(r"[^A-Za-z0-9.]+", "_", text).strip("_")[:24] or "x"


def expand(spec: Spec, where: str | None = None) -> list[Point]:
    """Every point of the spec: repeats x matrix (in key order) x workload levels, filtered.

    A point's id is stable: the swept values in words plus a hash of its resolved configuration,
    so the same configuration gets the same id in every run (what `--resume` relies on).
    """
    where = where or spec.path or "<spec>"
    axes = spec.sweep.matrix
    filters = [compile_filter(f) for f in spec.sweep.filters]
    keys = list(axes)
    points: list[Point] = []
    cache: dict[str, PointConfig] = {}
    for repeat in range(spec.sweep.repeats):
        for combo in itertools.product(*(axes[k] for k in keys)):
            raw = copy.deepcopy(spec.base)
            for k, v in zip(keys, combo):
                try:
                    set_path(raw, k, copy.deepcopy(v))
                except SpecError as err:
                    raise SpecError(f"{where}: sweep.matrix.{k}: {err}") from None
            ck = json.dumps(raw, sort_keys=True, default=str)
            if ck not in cache:
                try:
                    cache[ck] = PointConfig.model_validate(raw)
                except ValidationError as err:
                    context = ""
                    if keys:
                        context = " [sweep point " + ", ".join(f"{k}={v!r}" for k, v in zip(keys, combo)) + "]"
                    msg = format_errors(err, where, PointConfig)
                    raise SpecError("\n".join(line + context for line in msg.splitlines())) from None
            base_cfg = cache[ck]
            for users in base_cfg.workload.users:
                cfg = base_cfg.model_copy(deep=True)
                cfg.workload.users = [users]
                params = {k: v for k, v in zip(keys, combo)}
                params["workload.users"] = users
                names = {
                    "users": users,
                    "repeat": repeat,
                    "topology": cfg.notation(),
                    "dbms": cfg.topology.db.dbms,
                    **{t: getattr(cfg.topology, t).count for t in TIERS},
                    **params,
                }
                keep = True
                for i, tree in enumerate(filters):
                    try:
                        keep = keep and bool(eval_filter(tree, names, raw, spec.sweep.filters[i]))
                    except ValueError as err:
                        raise SpecError(f"{where}: sweep.filters[{i}]: {err}") from None
                    except TypeError as err:
                        raise SpecError(f"{where}: sweep.filters[{i}]: {spec.sweep.filters[i]!r}: {err}") from None
                if not keep:
                    continue
                points.append(_make_point(cfg, params, repeat, len(points), spec))
    return points


#: what decides the users' random draws: a point's seed is derived from these (and its repeat) only
DRAW_FIELDS = ("name", "benchmark", "mix", "scale", "workload")


def _make_point(cfg: PointConfig, params: dict[str, Any], repeat: int, index: int, spec: Spec) -> Point:
    dumped = cfg.model_dump(mode="json")
    dumped.pop("description", None)  # words do not change what runs: ids survive edits to them
    for nt in dumped.get("node_types", {}).values():
        nt.pop("description", None)
    canonical = json.dumps({"config": dumped, "repeat": repeat}, sort_keys=True)
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    words = []
    for k, v in params.items():
        short = "users" if k == "workload.users" else k.rsplit(".", 1)[-1]
        if k == "topology" and not isinstance(v, str):
            v = cfg.notation()  # an explicit table reads better as its notation
        words.append(f"{short}{_slug(v)}")
    if spec.sweep.repeats > 1:
        words.append(f"r{repeat}")
    pid = "-".join(words + [digest[:8]])
    # the users' random draws (their pages, think times, parameters) depend on what they do, not
    # on the system they meet: every configuration compared at one workload level and repeat gets
    # the same seed (common random numbers), so a difference between two configurations is
    # theirs, not the draw's (seed 000 §4's policies drew 40 % more heavy searches for one of them)
    draw = json.dumps({k: dumped.get(k) for k in DRAW_FIELDS} | {"repeat": repeat}, sort_keys=True)
    seed = (cfg.seed * 1_000_003 + int(hashlib.sha256(draw.encode()).hexdigest()[:8], 16)) % (2**31 - 1)
    return Point(id=pid, index=index, repeat=repeat, params=params, seed=seed, config=cfg)
