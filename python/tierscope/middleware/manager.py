"""The RAIDb-1 request manager: the backends, the read balancer, the write scheduler, the counts.

Reads go to one enabled backend (by the read policy, `balance`); writes go to every enabled backend under
one database-wide write lock (the pessimistic scheduler), held by an autocommit write until every
backend has executed it, and by an explicit transaction until it ends. A backend that fails a
write another backend executed is disabled and never used again in this process.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tierscope.middleware import balance
from tierscope.middleware import sql as sqlmod
from tierscope.middleware.pool import BackendConnection, BackendError, BackendPool

if TYPE_CHECKING:
    from tierscope.middleware.scram import ScramVerifier

WAIT_FIRST, WAIT_ALL = "first", "all"
WAITS = (WAIT_FIRST, WAIT_ALL)


class NoBackend(Exception):
    """No enabled backend is left to run a request."""


def log(message: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    print(f"{stamp} middleware: {message}", file=sys.stderr, flush=True)


@dataclass
class Backend:
    """One database server and what the manager knows about it."""

    name: str
    pool: BackendPool
    enabled: bool = True
    disabled_reason: str | None = None
    pending: int = 0  # requests executing (or waiting for a connection) on it: reads and writes
    reads: int = 0
    writes: int = 0  # write units it executed (successfully or not)
    failed_writes: int = 0
    writes_started: int = 0
    writes_done: int = 0
    weight: float = 1.0  # for weighted round robin
    read_latency_s: float | None = None  # moving average of its reads' durations (for lrt)
    #: reads in flight here when labels are tracked: token -> (expected seconds, started at, heavy)
    inflight: dict = field(default_factory=dict)
    heavy: int = 0  # heavy reads in flight here (labels tracked)
    heavy_reads: int = 0  # heavy reads it executed (labels tracked)
    write_progress: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def wait_for_writes(self, upto: int) -> None:
        """Wait until the writes started before a read was routed here have executed here
        (with wait=first a replica may still apply a write the client was already answered for)."""
        if self.writes_done >= upto:
            return
        async with self.write_progress:
            await self.write_progress.wait_for(lambda: self.writes_done >= upto or not self.enabled)

    def write_finished(self) -> None:
        """One more write is over here; reads waiting for it are woken."""
        self.writes_done += 1
        asyncio.get_running_loop().create_task(self.wake())

    async def wake(self) -> None:
        async with self.write_progress:
            self.write_progress.notify_all()


#: samples kept in the stats series at most (an hour at 50 ms)
SERIES_MAX = 72000


class RequestManager:
    _scram: ScramVerifier | None

    def scram_verifier(self) -> ScramVerifier:
        """The SCRAM-SHA-256 verifier of `password` that PostgreSQL clients must prove they know."""
        from tierscope.middleware.scram import ScramVerifier

        if self._scram is None:
            self._scram = ScramVerifier(self.password)
        return self._scram

    def __init__(
        self,
        backends: list[Backend],
        policy: str = balance.LPRF,
        wait: str = WAIT_FIRST,
        database: str = "rubbos",
        user: str = "postgres",
        track_labels: bool = False,
        heavy_factor: float = 10.0,
        protocol: str = "postgres",
        password: str = "",
    ):
        if policy not in balance.POLICIES:
            raise ValueError(f"policy: expected one of {balance.POLICIES}, got {policy!r}")
        if wait not in WAITS:
            raise ValueError(f"wait: expected one of {WAITS}, got {wait!r}")
        if not backends:
            raise ValueError("at least one backend is needed")
        self.backends = backends
        self.policy = policy
        self.wait = wait
        self.database = database
        self.user = user
        self.protocol = protocol  # the clients' and the backends' wire protocol: postgres | mysql
        self.password = password  # what clients log in with (the backends' password)
        self._scram = None  # the password's SCRAM verifier, made at the first login
        self.write_lock = asyncio.Lock()
        self._rr_next = 0
        self._wrr_current = [0.0] * len(backends)
        self._kinds: dict[str, str] = {}
        # per-label service times (the aware policy; any policy with track_labels)
        self.track = track_labels or policy == balance.AWARE
        self.heavy_factor = heavy_factor
        self._labels: dict[str, str] = {}  # statement text -> label
        self.service_s: dict[str, float] = {}  # label -> moving average of its reads' service times
        self.label_counts: dict[str, int] = {}
        self.heavy_set: set[str] = set()
        self.typical_s: float | None = None
        self._tokens = 0
        self._heavy_checked = 0
        # the series sampled every series_interval seconds (pending, heavy in flight, reads done)
        self.series_interval = 0.0
        self.series: deque = deque(maxlen=SERIES_MAX)
        self._series_handle: asyncio.TimerHandle | None = None
        self.inflight: set[asyncio.Task] = set()  # writes still running on slower backends
        self.parameters: dict[str, str] = {}
        self.started = time.time()
        self.counts = {
            "sessions": 0,
            "units": 0,
            "reads": 0,
            "writes": 0,
            "transaction_units": 0,
            "read_retries": 0,
            "named_statements": 0,
            "flushed_units": 0,
            "errors_to_clients": 0,
            "macros_rewritten": 0,
            "write_lock_wait_s": 0.0,
        }

    def classify(self, text: str) -> str:
        """READ, WRITE or COPY for a statement text (cached by the text without its trailing
        request-id comment)."""
        key = sqlmod.strip_trailing_comment(text)
        kind = self._kinds.get(key)
        if kind is None:
            kind = sqlmod.COPY if sqlmod.first_word(key) == "COPY" else sqlmod.classify(key)
            if len(self._kinds) > 10000:
                self._kinds.clear()
            self._kinds[key] = kind
        return kind

    # --- backends ----------------------------------------------------------------------------
    def enabled(self) -> list[Backend]:
        return [b for b in self.backends if b.enabled]

    def label(self, texts: list[str]) -> str:
        """The label of a unit running `texts` (cached by the joined text)."""
        key = texts[0] if len(texts) == 1 else "\n".join(texts)
        lab = self._labels.get(key)
        if lab is None:
            lab = "; ".join(sqlmod.label(t) for t in texts)
            if len(self._labels) > 10000:
                self._labels.clear()
            self._labels[key] = lab
        return lab

    def choose_read(self, label: str | None = None) -> Backend:
        """The backend for the next read (of `label`, when labels are tracked) by the configured
        policy; counts it as pending there."""
        flags = [b.enabled for b in self.backends]
        if self.policy == balance.LPRF:
            i = balance.choose_lprf([b.pending for b in self.backends], flags)
        elif self.policy == balance.AWARE:
            now, typical = time.monotonic(), self.typical_s or 0.0
            waits = [
                balance.expected_wait(b.inflight.values(), now, b.pending - len(b.inflight), typical)
                for b in self.backends
            ]
            own = self.service_s.get(label) if label in self.heavy_set else None
            i = balance.choose_aware(
                waits, [b.pending for b in self.backends], flags, [b.heavy for b in self.backends], own
            )
        elif self.policy == balance.WRR:
            i, self._wrr_current = balance.choose_wrr(self._wrr_current, [b.weight for b in self.backends], flags)
        elif self.policy == balance.LRT:
            i = balance.choose_lrt([b.pending for b in self.backends], [b.read_latency_s for b in self.backends], flags)
        else:
            i, self._rr_next = balance.choose_rr(self._rr_next, flags)
        if i is None:
            raise NoBackend("no database backend is enabled")
        b = self.backends[i]
        b.pending += 1
        return b

    def read_begin(self, backend: Backend, label: str | None) -> int | None:
        """A read of `label` was routed to `backend` (labels tracked): remember what it expects."""
        if label is None:
            return None
        self._tokens += 1
        expected = self.service_s.get(label)
        if expected is None:
            expected = self.typical_s or 0.0
        heavy = label in self.heavy_set
        backend.inflight[self._tokens] = (expected, time.monotonic(), heavy)
        if heavy:
            backend.heavy += 1
            backend.heavy_reads += 1
        return self._tokens

    def read_end(self, backend: Backend, token: int | None) -> None:
        if token is not None:
            entry = backend.inflight.pop(token, None)
            if entry is not None and entry[2]:
                backend.heavy -= 1

    def read_done(self, backend: Backend, seconds: float, label: str | None = None) -> None:
        """A read executed on `backend` in `seconds` (its moving average feeds the lrt policy; the
        label's feeds the aware policy)."""
        backend.read_latency_s = balance.ewma(backend.read_latency_s, seconds)
        if label is not None:
            if label not in self.service_s and len(self.service_s) > 10000:
                self.service_s.clear()
                self.label_counts.clear()
            self.service_s[label] = balance.ewma(self.service_s.get(label), seconds)
            n = self.label_counts[label] = self.label_counts.get(label, 0) + 1
            if n == 1 or self._tokens - self._heavy_checked >= 100:
                self.update_heavy()

    def update_heavy(self) -> None:
        """Which labels are heavy now and the typical service time (every 100 reads, and when a
        label is new)."""
        self._heavy_checked = self._tokens
        self.heavy_set, self.typical_s = balance.heavy_labels(self.service_s, self.label_counts, self.heavy_factor)

    # --- the series --------------------------------------------------------------------------
    def start_series(self, interval: float) -> None:
        """Sample every backend's pending requests, heavy reads in flight and reads done every
        `interval` seconds (the last SERIES_MAX samples are kept for the stats)."""
        if interval <= 0:
            return
        self.series_interval = interval
        loop = asyncio.get_running_loop()
        t0 = loop.time()

        def tick(k: int) -> None:
            self.series.append(
                (
                    round(time.time() - self.started, 3),
                    tuple(b.pending for b in self.backends),
                    tuple(b.heavy for b in self.backends),
                    tuple(b.reads for b in self.backends),
                )
            )
            # on the grid t0 + k x interval (no drift); a late tick skips the slots it missed
            k = max(k + 1, int((loop.time() - t0) / interval) + 1)
            self._series_handle = loop.call_at(t0 + k * interval, tick, k)

        tick(0)

    def stop_series(self) -> None:
        if self._series_handle is not None:
            self._series_handle.cancel()
            self._series_handle = None

    def series_stats(self) -> dict:
        names = [b.name for b in self.backends]
        rows = list(self.series)
        return {
            "interval_s": self.series_interval,
            "t_s": [r[0] for r in rows],
            "pending": {n: [r[1][i] for r in rows] for i, n in enumerate(names)},
            "heavy": {n: [r[2][i] for r in rows] for i, n in enumerate(names)},
            "reads": {n: [r[3][i] for r in rows] for i, n in enumerate(names)},
        }

    def disable(self, backend: Backend, reason: str) -> None:
        if not backend.enabled:
            return
        backend.enabled = False
        backend.disabled_reason = reason
        backend.pool.close()
        log(f"backend {backend.name} DISABLED: {reason}")
        asyncio.get_running_loop().create_task(backend.wake())  # reads waiting on it choose again

    async def check_backends(self, timeout: float = 10.0) -> None:
        """Open one connection to every backend (retrying up to `timeout` s); a backend that never
        answers is disabled. Keeps the first backend's server parameters for the clients."""
        deadline = time.monotonic() + timeout
        for b in self.backends:
            while True:
                try:
                    conn = await b.pool.acquire()
                except BackendError as err:
                    if time.monotonic() < deadline:
                        await asyncio.sleep(0.2)
                        continue
                    self.disable(b, f"unreachable at start: {err}")
                    break
                if not self.parameters:
                    self.parameters = dict(conn.parameters)
                b.pool.release(conn)
                break
        if not self.enabled():
            raise NoBackend(
                "no database backend answered: " + "; ".join(f"{b.name}: {b.disabled_reason}" for b in self.backends)
            )

    async def acquire(self, backend: Backend) -> BackendConnection:
        return await backend.pool.acquire()

    # --- counts ------------------------------------------------------------------------------
    def stats(self) -> dict:
        return {
            "protocol": self.protocol,
            "implementation": "python",
            "policy": self.policy,
            "wait": self.wait,
            "uptime_s": round(time.time() - self.started, 3),
            **{k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.counts.items()},
            "disabled": [b.name for b in self.backends if not b.enabled],
            "backends": [
                {
                    "name": b.name,
                    "enabled": b.enabled,
                    "disabled_reason": b.disabled_reason,
                    "reads": b.reads,
                    "weight": b.weight,
                    "read_latency_ms": None if b.read_latency_s is None else round(1e3 * b.read_latency_s, 3),
                    "writes": b.writes,
                    "failed_writes": b.failed_writes,
                    "connections_opened": b.pool.opened,
                    "pool": b.pool.size,
                    "heavy_reads": b.heavy_reads,
                }
                for b in self.backends
            ],
            "labels": {
                "tracked": self.track,
                "heavy_factor": self.heavy_factor,
                "typical_ms": None if self.typical_s is None else round(1e3 * self.typical_s, 3),
                "heavy": sorted(self.heavy_set),
                "service_ms": {
                    k: round(1e3 * v, 3) for k, v in sorted(self.service_s.items(), key=lambda kv: -kv[1])[:50]
                },
                "counts": {
                    k: self.label_counts.get(k, 0)
                    for k in sorted(self.service_s, key=lambda k: -self.service_s[k])[:50]
                },
            },
            "series": self.series_stats(),
        }

    def write_stats(self, path: str | Path) -> None:
        path = Path(path)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.stats(), indent=1) + "\n")
        tmp.replace(path)

    async def drain(self, timeout: float = 10.0) -> None:
        """Wait (up to `timeout` s) for writes still running on slower backends."""
        if self.inflight:
            await asyncio.wait(set(self.inflight), timeout=timeout)

    def close(self) -> None:
        for b in self.backends:
            b.pool.close()


def make_backends(
    addresses: list[str], user: str, database: str, pool: int, password: str = "", protocol: str = "postgres"
) -> list[Backend]:
    """Backends from "host:port" strings, in the order given (the LPRF order)."""
    out = []
    for a in addresses:
        host, sep, port = a.rpartition(":")
        if not sep or not port.isdigit() or not host:
            raise ValueError(f"backend {a!r}: expected HOST:PORT")
        out.append(
            Backend(
                a,
                BackendPool(
                    a, host.strip("[]"), int(port), user, database, size=pool, password=password, protocol=protocol
                ),
            )
        )
    if len({b.name for b in out}) != len(out):
        raise ValueError(f"backends: the same address is given twice: {addresses}")
    return out
