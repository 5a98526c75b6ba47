"""Reading an experiment from disk: a run directory ``DIR/<run>/<point>/`` (Parquet tables
`requests`, `client_requests`, `resources`, `events` and a `manifest.json` per point, as the runner
and the simulator write them), a directory of several runs, a single point directory, or plain
trace files.

A point's workload level, think time, configuration and measured interval come from its manifest
(`tierscope.manifest`, the typed contract; a file that is not one is an error naming the field).
Without a manifest, the directory above the point names its configuration when several runs are
given (``DIR/<configuration>/<point>/``). Missing pieces leave the matching analyses out, with a
note.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute  # noqa: F401 (pa.compute)
import pyarrow.parquet as pq

from tierscope import tables
from tierscope.manifest import Manifest
from tierscope.manifest import read as read_manifest

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
        return self[name] if name in self else default  # noqa: SIM401 (self.get is this method)

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
            return int(self._loaded[name].num_rows)
        if name in self.files:
            return int(pq.ParquetFile(self.files[name]).metadata.num_rows)
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
    manifest: Manifest = field(default_factory=Manifest)
    tables: LazyTables = field(default_factory=LazyTables)

    @property
    def seconds(self) -> float | None:
        if self.run_interval_ns:
            return (self.run_interval_ns[1] - self.run_interval_ns[0]) / 1e9
        return None


def is_point_dir(path: Path) -> bool:
    return path.is_dir() and (
        (path / "manifest.json").is_file() or any((path / f"{n}.parquet").is_file() for n in TABLE_NAMES)
    )


def read_point(path: Path) -> Point:
    """One point directory: its manifest (if any) and whichever tables exist."""
    mpath = path / "manifest.json"
    m = read_manifest(mpath) if mpath.is_file() else Manifest()
    point = Point(path=path, name=path.name, manifest=m)
    point.users = m.point.users
    point.config = m.configuration()
    point.think_time_s = m.point.think_time_s
    point.run_interval_ns = m.run_interval()
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
