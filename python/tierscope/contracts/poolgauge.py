"""The app server's connections to its database in use: a gauge its processes write and the lab
reads (seed 004 §5: the connections pinned at their maximum while neither the CPU nor the disk is
saturated).

A pooled connection the app holds between the statements of one page is idle in the database's
eyes (`services._accounts.BusySessions` counts statements and open transactions), yet no other
request can have it: the pool's own count of connections taken is what runs out. A connection is
taken from the moment a request asks for it until it is given back, and a connection given back
while other requests wait passes to one of them without becoming free. So the count is the
requests in their database phase (holding a connection or queued for one), at most the pool's
size (`limit`). Counted from the moment a request holds it, a connection passed on reads as free
for as long as its next holder waits for the interpreter's lock (up to Python's 5 ms switch
interval): two workers with a pool of one each, queued for all through a run, read as both taken
in only 52-85 % of the 1-s samples (issue 22, docs/bookstore.md).

Each process of an app server whose environment names a directory (`ENV`) writes its count into
a file of its own there, `<pid>` (8 bytes, little endian, through a shared mapping: one store per
change, no system call); the lab sums the files of the processes still alive (`in_use`).

This module imports nothing of the project (contracts are the ground floor).
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
from pathlib import Path

#: the environment variable naming the gauge directory
ENV = "TIERSCOPE_POOL_GAUGE"
_FMT = struct.Struct("<q")


class PoolGauge:
    """The writer: `add(+1)` when a request asks for a connection, `add(-1)` when it gives it back
    (or gives up); the file holds the count, at most `limit` (the pool's size; None: no bound).
    Thread-safe; a process forked after its parent made the gauge writes a file of its own."""

    def __init__(self, directory: str | Path, limit: int | None = None):
        self.directory = Path(directory)
        self.limit = limit
        self._lock = threading.Lock()
        self._pid = 0
        self._n = 0
        self._map: mmap.mmap | None = None

    def _mapping(self) -> mmap.mmap | None:
        pid = os.getpid()
        if self._pid != pid:  # first use, or a child of the process that made the gauge
            self._pid, self._n, self._map = pid, 0, None
            try:
                fd = os.open(self.directory / str(pid), os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
                try:
                    os.ftruncate(fd, _FMT.size)
                    self._map = mmap.mmap(fd, _FMT.size)
                finally:
                    os.close(fd)
            except OSError:
                self._map = None  # no gauge: the app serves as before
        return self._map

    def add(self, delta: int) -> None:
        with self._lock:
            m = self._mapping()
            self._n += delta
            if m is not None:
                _FMT.pack_into(m, 0, self._n if self.limit is None else min(self._n, self.limit))


def from_env(limit: int | None = None) -> PoolGauge | None:
    """The gauge this process' environment asks for, if any, for a pool of `limit` connections."""
    d = os.environ.get(ENV)
    return PoolGauge(d, limit) if d else None


def in_use(directory: str | Path) -> int:
    """The connections taken now, summed over the live processes' files in `directory`."""
    total = 0
    for f in Path(directory).iterdir():
        if not f.name.isdigit() or not Path(f"/proc/{f.name}").exists():  # a worker gone
            continue
        try:
            raw = f.read_bytes()
        except OSError:
            continue
        if len(raw) >= _FMT.size:
            total += max(0, _FMT.unpack_from(raw)[0])
    return total
