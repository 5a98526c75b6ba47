"""Snapshot and restore the database files of an app's loaded data (RUBBoS, the bookstore), so
every experiment point starts from the same state in seconds instead of reloading.

A snapshot is a copy of the server's data directory taken while the server is stopped (a clean
shutdown, so the copy is consistent), plus `meta.json` (dbms, scale, seed, load time, rows).
Copies use `cp -a --reflink=auto` (a reflink on filesystems that support it, otherwise a plain
copy that keeps owners and modes).

Dates in the data are relative to the load time; a snapshot older than `max_age_s` (default one
day) is reported stale so the caller reloads instead (RUBBoS's OlderStories looks at the last 7
days); so is one made by another version of the app's data generator (`generator`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

CACHE = Path.home() / ".cache" / "tierscope"


def default_root(app: str) -> Path:
    """Where an app's snapshots live: ~/.cache/tierscope/<app>/snapshots."""
    return CACHE / app / "snapshots"


@dataclass(frozen=True)
class Snapshot:
    path: Path
    generator: int | None = None  # the data generator version a fresh snapshot must have

    @property
    def data(self) -> Path:
        return self.path / "data"

    @property
    def meta(self) -> dict:
        try:
            return json.loads((self.path / "meta.json").read_text())
        except (OSError, ValueError):
            return {}

    def exists(self) -> bool:
        return self.data.is_dir() and bool(self.meta)

    def age_s(self) -> float:
        return time.time() - float(self.meta.get("loaded_at", 0))

    def fresh(self, max_age_s: float = 86400.0) -> bool:
        """Exists, is younger than `max_age_s` and was made by the `generator` version."""
        return (
            self.exists()
            and self.age_s() < max_age_s
            and (self.generator is None or self.meta.get("generator") == self.generator)
        )


def snapshot_for(
    app: str, dbms: str, scale: str, seed: int, generator: int | None = None, root: Path | None = None
) -> Snapshot:
    return Snapshot(Path(root or default_root(app)) / f"{dbms}-{scale}-seed{seed}", generator)


def copy_tree(src: Path, dst: Path) -> None:
    """Copy a directory keeping owners and modes (reflink when the filesystem can), then write the
    copy to disk and drop it from the page cache (`evict`)."""
    if dst.exists():
        shutil.rmtree(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(["cp", "-a", "--reflink=auto", str(src), str(dst)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"copy {src} -> {dst} failed: {out.stderr.strip()}")
    evict(dst)


def evict(root: Path) -> int:
    """Write every file under `root` to disk and drop its pages from the page cache; returns the
    bytes dropped. A restored database then reads its data through its own host's memory cgroup
    (page cache is charged to the cgroup that first reads a page: pages the copy left cached
    would be charged to the copier, and a database host's memory limit would never bite)."""
    import os

    total = 0
    for base, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(base, name)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                continue  # sockets, dangling links
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                total += os.fstat(fd).st_size
            except OSError:
                pass
            finally:
                os.close(fd)
    return total


def take(service, snap: Snapshot, meta: dict) -> Snapshot:
    """Stop `service` (Postgres or MariaDB), copy its data directory into `snap`, start it again."""
    was_running = service.running()
    if was_running:
        service.stop()
    tmp = snap.path.with_name(snap.path.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    copy_tree(service.data_dir, tmp / "data")
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
    if snap.path.exists():
        shutil.rmtree(snap.path)
    tmp.rename(snap.path)
    if was_running:
        service.start()
    return snap


def restore(service, snap: Snapshot) -> None:
    """Stop `service`, replace its data directory by the snapshot's, start it again."""
    if not snap.exists():
        raise FileNotFoundError(f"no snapshot at {snap.path}")
    was_running = service.running()
    if was_running:
        service.stop()
    copy_tree(snap.data, service.data_dir)
    if was_running:
        service.start()
