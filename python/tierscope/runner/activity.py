"""The servers' own view of their database connections, sampled beside the resource monitor: a
database server's busy sessions, an app server's connections taken from its pools.

A count of established sockets (the monitor's `sockets_util`) says how many connections the pools
ever opened: a pool, once full, keeps them established whether they are used or not. What seed
004 §5 saw pinned at its maximum at 60 % memory is the connections *busy*: this sampler asks each
database server, once per monitor interval on one administrator connection, how many client
sessions are inside a statement or an open transaction (`services._accounts.BusySessions`), and
each app server how many connections its workers have taken from their pools (`contracts.poolgauge`:
a connection held between the statements of a page is idle to the database but taken), and
adds to the point's resources:

| metric | unit | what |
|---|---|---|
| db_connections_busy | count | client sessions busy (database server) or connections taken from the pools, held or queued for (app server), at the sample |
| connections_util | percent | the same against the client sessions the server admits (its `max_connections` less what it keeps for administrators), or against the app server's pools together |

A sample that fails (the server restarting in a kill drill) is skipped and counted; a server whose
probe cannot open is left out with a note. Nothing here knows a DBMS: the services give the probe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Protocol

import pyarrow as pa

from tierscope.tables import RESOURCES


class Probe(Protocol):
    #: the client sessions the server admits
    limit: int

    def busy(self) -> int: ...
    def close(self) -> None: ...


class ActivitySampler:
    """Sample `probes` (server name -> probe) every `interval` seconds on a thread until `stop()`."""

    def __init__(self, probes: Mapping[str, Probe], interval: float):
        self.probes = dict(probes)
        self.interval = interval
        self.limits = {name: p.limit for name, p in self.probes.items()}
        self.rows: list[tuple[int, str, int]] = []
        self.failed: dict[str, int] = {name: 0 for name in self.probes}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="activity-sampler", daemon=True)

    def start(self) -> ActivitySampler:
        self._thread.start()
        return self

    def _loop(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            for name, probe in self.probes.items():
                try:
                    n = probe.busy()
                except Exception:
                    self.failed[name] += 1
                    continue
                self.rows.append((time.time_ns(), name, n))
            next_at += self.interval
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> pa.Table:
        """Stop, close the probes and return the samples as resources rows."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5 + self.interval)
        for probe in self.probes.values():
            probe.close()
        return activity_table(self.rows, self.limits)

    def notes(self) -> list[str]:
        return [f"{name}: {n} busy-connection samples failed and were skipped" for name, n in self.failed.items() if n]


def activity_table(rows: list[tuple[int, str, int]], limits: Mapping[str, int]) -> pa.Table:
    """Resources rows from (ts_ns, host, busy sessions) samples: `db_connections_busy` for each,
    `connections_util` (percent of `limits[host]`) where the host has a limit above 0."""
    ts: list[int] = []
    host: list[str] = []
    metric: list[str] = []
    value: list[float] = []
    unit: list[str] = []
    for t, name, n in rows:
        ts.append(t)
        host.append(name)
        metric.append("db_connections_busy")
        value.append(float(n))
        unit.append("count")
        limit = limits.get(name, 0)
        if limit > 0:
            ts.append(t)
            host.append(name)
            metric.append("connections_util")
            value.append(n * 100.0 / limit)
            unit.append("percent")
    return pa.table({"ts_ns": ts, "host": host, "metric": metric, "value": value, "unit": unit}, schema=RESOURCES)
