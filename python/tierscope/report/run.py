"""Reading an experiment from disk: a run directory ``DIR/<run>/<point>/`` (Parquet tables
`requests`, `client_requests`, `resources`, `events` and a `manifest.json` per point, as the runner
writes them), a directory of several runs, a single point directory, or plain trace files.

The manifest is read tolerantly: the workload level is the first ``users`` found in it (e.g.
``{"point": {"users": 300}}``), the configuration the first ``topology`` (a string in #W/#A/#C/#D
notation, or a mapping), the think time the first ``think_time_s`` / ``think_time``, and the
measured interval the ``run`` phase (``{"phases": {"run": {"start_ns": .., "end_ns": ..}}}`` or a
``[start_ns, end_ns]`` pair, or the manifest's own ``start_ns``/``end_ns`` as the simulator writes).
Without a topology in the manifest, the directory above the point names its configuration when
several runs are given (``DIR/<configuration>/<point>/``). Missing pieces leave the matching
analyses out, with a note.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute  # noqa: F401 (pa.compute)
import pyarrow.parquet as pq

from tierscope import tables

TABLE_NAMES = ("requests", "client_requests", "resources", "events")


class LazyTables:
    """A point's tables by name, each read from its Parquet file on first use (big `requests`
    tables of points that are not analysed are never loaded)."""

    def __init__(self, files: dict[str, Path] | None = None) -> None:
        self.files: dict[str, Path] = dict(files or {})
        self._loaded: dict[str, pa.Table] = {}

    def __contains__(self, name: object) -> bool:
        return name in self.files or name in self._loaded

    def __getitem__(self, name: str) -> pa.Table:
        if name not in self._loaded:
            if name not in self.files:
                raise KeyError(name)
            self._loaded[name] = tables.read(self.files[name], name)
        return self._loaded[name]

    def __setitem__(self, name: str, table: pa.Table) -> None:
        self._loaded[name] = table

    def get(self, name: str, default: pa.Table | None = None) -> pa.Table | None:
        return self[name] if name in self else default

    def front_tier(self, tier: str = "web") -> pa.Table | None:
        """Only the rows of one tier of `requests`, read column-pruned and filtered, not cached."""
        if "requests" in self._loaded:
            t = self._loaded["requests"]
            return t.filter(pa.compute.equal(t.column("tier"), tier))
        if "requests" not in self.files:
            return None
        columns = ["tier", "arrival_ns", "departure_ns", "status"]
        return pq.read_table(self.files["requests"], columns=columns, filters=[("tier", "=", tier)])

    def rows(self, name: str) -> int:
        """Row count without reading the table (Parquet metadata); 0 when absent."""
        if name in self._loaded:
            return self._loaded[name].num_rows
        if name in self.files:
            return pq.ParquetFile(self.files[name]).metadata.num_rows
        return 0


@dataclass
class Point:
    """One experiment point: where it is, its parameters and its tables (absent ones are None)."""

    path: Path
    name: str
    users: float | None = None
    config: str | None = None
    think_time_s: float | None = None
    run_interval_ns: tuple[int, int] | None = None
    manifest: dict = field(default_factory=dict)
    tables: LazyTables = field(default_factory=LazyTables)

    @property
    def seconds(self) -> float | None:
        if self.run_interval_ns:
            return (self.run_interval_ns[1] - self.run_interval_ns[0]) / 1e9
        return None


def _find(obj: Any, keys: tuple[str, ...], depth: int = 0) -> Any:
    """The first value stored under one of `keys`, breadth first through nested mappings."""
    if not isinstance(obj, dict) or depth > 5:
        return None
    for key in keys:
        value = obj.get(key)
        if value is not None and (key == "topology" or not isinstance(value, (dict, list))):
            return value
    for value in obj.values():
        found = _find(value, keys, depth + 1)
        if found is not None:
            return found
    return None


def _interval(manifest: dict) -> tuple[int, int] | None:
    phases = manifest.get("phases") if isinstance(manifest.get("phases"), dict) else None
    if phases is None:
        point = manifest.get("point")
        phases = point.get("phases") if isinstance(point, dict) and isinstance(point.get("phases"), dict) else None
    run = phases.get("run") if phases else None
    if run is None and isinstance(manifest.get("start_ns"), int) and isinstance(manifest.get("end_ns"), int):
        run = [manifest["start_ns"], manifest["end_ns"]]  # the simulator: the measured interval after warm-up
    if isinstance(run, dict):
        start, end = run.get("start_ns", run.get("start")), run.get("end_ns", run.get("end"))
    elif isinstance(run, (list, tuple)) and len(run) == 2:
        start, end = run
    else:
        return None
    try:
        return int(start), int(end)
    except (TypeError, ValueError):
        return None


def _config(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, dict):  # {"web": {"count": 1}, ...} or {"web": 1, ...}
        parts = []
        for tier in ("web", "app", "middleware", "db"):
            v = value.get(tier)
            count = v.get("count") if isinstance(v, dict) else v
            parts.append(str(count if count is not None else 0))
        return "/".join(parts)
    return str(value)


def configuration_name(topology: str | None, manifest: dict) -> str | None:
    """A point's configuration: its topology plus every swept value but the workload level, so a
    sweep over, say, the database host's memory gives one configuration (one load curve, one row of
    the bottleneck map) per memory size: ``1W/1A/0/1D-P node_types.D.memory=150MiB``."""
    point = manifest.get("point")
    params = point.get("params") if isinstance(point, dict) else None
    if not isinstance(params, dict):
        return topology
    swept = [f"{k}={v}" for k, v in params.items() if k not in ("workload.users", "topology")]
    if not swept:
        return topology
    return " ".join(([topology] if topology else []) + swept)


def is_point_dir(path: Path) -> bool:
    return path.is_dir() and (
        (path / "manifest.json").is_file() or any((path / f"{n}.parquet").is_file() for n in TABLE_NAMES))


def read_point(path: Path) -> Point:
    """One point directory: its manifest (if any) and whichever tables exist."""
    manifest: dict = {}
    mpath = path / "manifest.json"
    if mpath.is_file():
        try:
            manifest = json.loads(mpath.read_text())
        except ValueError as err:
            raise ValueError(f"{mpath}: not valid JSON ({err})") from None
    point = Point(path=path, name=path.name, manifest=manifest)
    users = _find(manifest, ("users",))
    point.users = float(users) if isinstance(users, (int, float)) else None
    point.config = configuration_name(_config(_find(manifest, ("topology", "config", "configuration"))), manifest)
    think = _find(manifest, ("think_time_s", "think_time"))
    if isinstance(think, (int, float)):
        point.think_time_s = float(think)
    elif isinstance(think, str):
        try:
            from tierscope.spec import parse_duration

            point.think_time_s = parse_duration(think)
        except (ImportError, ValueError):
            pass
    point.run_interval_ns = _interval(manifest)
    point.tables = LazyTables({n: path / f"{n}.parquet" for n in TABLE_NAMES if (path / f"{n}.parquet").is_file()})
    return point


def find_points(root: Path, max_depth: int = 3) -> list[Point]:
    """Every point directory under `root` (root itself included), sorted by configuration, users, name."""
    root = Path(root)
    found: list[Path] = []

    def walk(p: Path, depth: int) -> None:
        if is_point_dir(p):
            found.append(p)
            return
        if depth >= max_depth:
            return
        for child in sorted(c for c in p.iterdir() if c.is_dir()):
            walk(child, depth + 1)

    walk(root, 0)
    points = [read_point(p) for p in found]
    for p in points:  # DIR/<configuration>/<point>/ without a topology in the manifest: the directory names it
        if p.config is None and p.path.parent != root and p.path != root:
            p.config = p.path.parent.name
    points.sort(key=lambda p: (p.config or "", p.users if p.users is not None else float("inf"), p.name))
    return points
