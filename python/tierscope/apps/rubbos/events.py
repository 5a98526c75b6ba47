"""The application server's own events: garbage-collection pauses and injected pauses.

Each worker process records rows of the `events` table (tierscope.tables.EVENTS): `gc` from
Python's `gc.callbacks` (start and stop of every collection), and `injected_pause` for pauses the
lab asks for (a stop-the-world stall of the whole worker, like a JVM full GC, see `pause`).
Rows are buffered in memory and appended as JSON lines to `<dir>/events-<host>-<pid>.jsonl` by a
background thread (every `flush_s`) and at exit; `collect(dir)` reads every worker's file into one
table.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa

from tierscope import tables


class EventRecorder:
    """Records this process's GC and injected pauses as `events` rows."""

    def __init__(self, directory: str | Path, host: str, flush_s: float = 0.5):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.host = host
        self.pid = os.getpid()
        self.path = self.directory / f"events-{host}-{self.pid}.jsonl"
        self._rows: list[dict] = []
        self._lock = threading.Lock()
        self._gc_start: int | None = None
        self._stop = threading.Event()
        self._flush_s = flush_s
        self._thread = threading.Thread(target=self._flusher, name="events-flush", daemon=True)
        gc.callbacks.append(self._on_gc)
        self._thread.start()
        atexit.register(self.close)

    # gc.callbacks run with the GIL held inside the collector: keep this minimal (no I/O).
    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.time_ns()
        elif phase == "stop" and self._gc_start is not None:
            end = time.time_ns()
            detail = f"generation={info.get('generation')} collected={info.get('collected')} pid={self.pid}"
            self._rows.append(
                {"start_ns": self._gc_start, "end_ns": end, "host": self.host, "kind": "gc", "detail": detail}
            )
            self._gc_start = None

    def record(self, start_ns: int, end_ns: int, kind: str, detail: str = "") -> None:
        with self._lock:
            self._rows.append(
                {"start_ns": start_ns, "end_ns": end_ns, "host": self.host, "kind": kind, "detail": detail}
            )

    def pause(self, ms: float) -> None:
        """Stall the whole process for `ms` milliseconds and record it as `injected_pause`.

        The calling thread spins while holding the GIL with a switch interval longer than the
        pause, so no other thread of this worker runs: requests in flight and new connections
        wait, as in a stop-the-world collection.
        """
        old = sys.getswitchinterval()
        start = time.time_ns()
        end_at = time.perf_counter() + ms / 1000.0
        sys.setswitchinterval(ms / 1000.0 + 1.0)
        try:
            while time.perf_counter() < end_at:
                pass
        finally:
            sys.setswitchinterval(old)
        self.record(start, time.time_ns(), "injected_pause", f"ms={ms:g} pid={self.pid}")

    def flush(self) -> int:
        with self._lock:
            rows, self._rows = self._rows, []
        if not rows:
            return 0
        with open(self.path, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        return len(rows)

    def _flusher(self) -> None:
        while not self._stop.wait(self._flush_s):
            with contextlib.suppress(OSError):
                self.flush()

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._on_gc)
        self.flush()


def collect(directory: str | Path) -> pa.Table:
    """Every worker's events in `directory` as one `events` table (sorted by start).

    Lines that are not valid JSON objects with the required fields are skipped (a worker killed
    mid-write leaves at most one partial last line).
    """
    rows = []
    for path in sorted(Path(directory).glob("events-*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                r = json.loads(line)
                rows.append({k: r[k] for k in ("start_ns", "end_ns", "host", "kind")} | {"detail": r.get("detail")})
            except (ValueError, KeyError, TypeError):
                continue
    rows.sort(key=lambda r: r["start_ns"])
    if not rows:
        return tables.empty("events")
    return tables.conform(pa.Table.from_pylist(rows), "events")
