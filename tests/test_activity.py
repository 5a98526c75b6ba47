"""The database servers' own count of their busy connections (`runner.activity`, issue 22: seed
004's 60 % finding is the connections busy, not established). Ground truth is the sessions the test
opens itself: some inside a statement, one between the statements of an open transaction, some
idle; the probe must count exactly the busy ones, on real PostgreSQL and MariaDB servers."""

from __future__ import annotations

import os
import threading
import time

import pytest

from conftest import needs_root
from tierscope.analysis.whitebox import is_soft, resource_of, whitebox
from tierscope.runner.activity import ActivitySampler, activity_table
from tierscope.services.base import free_port
from tierscope.services.mariadb import MariaDB
from tierscope.services.postgres import Postgres, pg_bindir
from tierscope.testbed.host import Host

SLEEPING = 3  # sessions inside a statement
IDLE = 2  # sessions back in the "pool": connected, nothing running


def test_busy_samples_become_connections_util_against_the_servers_limit():
    rows = [(1_000, "db1", 8), (2_000, "db1", 32), (2_000, "db2", 5)]
    t = activity_table(rows, {"db1": 32})
    got = list(zip(t["host"].to_pylist(), t["metric"].to_pylist(), t["value"].to_pylist(), strict=True))
    assert got == [
        ("db1", "db_connections_busy", 8.0), ("db1", "connections_util", 25.0),
        ("db1", "db_connections_busy", 32.0), ("db1", "connections_util", 100.0),
        ("db2", "db_connections_busy", 5.0),  # no limit given: no utilisation
    ]  # fmt: skip
    assert resource_of("connections_util") == "connections" and is_soft("connections_util")


def test_a_failing_sample_is_skipped_and_counted():
    class Flaky:
        calls = 0
        limit = 10

        def busy(self) -> int:
            self.calls += 1
            if self.calls % 2 == 0:
                raise ConnectionError("server restarting")
            return 7

        def close(self) -> None:
            pass

    sampler = ActivitySampler({"db1": Flaky()}, interval=0.02).start()
    time.sleep(0.3)
    table = sampler.stop()
    busy = [
        v
        for m, v in zip(table["metric"].to_pylist(), table["value"].to_pylist(), strict=True)
        if m == "db_connections_busy"
    ]
    assert busy and set(busy) == {7.0}
    assert sampler.failed["db1"] >= 1 and sampler.notes() == [
        f"db1: {sampler.failed['db1']} busy-connection samples failed and were skipped"
    ]


def test_saturated_connections_rank_after_a_saturated_cpu():
    import pyarrow as pa

    n = 20
    res = pa.table(
        {
            "ts_ns": [i * 1_000_000_000 for i in range(n)] * 2,
            "host": ["db1"] * (2 * n),
            "metric": ["connections_util"] * n + ["cpu_util"] * n,
            "value": [100.0] * n + [99.0] * n,
            "unit": ["percent"] * (2 * n),
        }
    )
    wb = whitebox([(100, res)])
    assert wb.saturated[100.0] == [("db1", "cpu_util"), ("db1", "connections_util")]


def _count_while(probe, open_sessions) -> list[int]:
    """Open the sessions (each thread holds its own until released), sample the probe while they
    hold, release; the samples taken once every session was in place."""
    ready = threading.Barrier(len(open_sessions) + 1)
    release = threading.Event()
    errors: list[BaseException] = []

    def hold(open_one):
        try:
            open_one(ready, release)
        except BaseException as e:  # noqa: BLE001 (reported by the test)
            errors.append(e)
            ready.abort()

    threads = [threading.Thread(target=hold, args=(f,), daemon=True) for f in open_sessions]
    for th in threads:
        th.start()
    ready.wait(timeout=20)
    time.sleep(0.3)  # the statements reach the server
    samples = [probe.busy() for _ in range(5)]
    release.set()
    for th in threads:
        th.join(timeout=20)
    assert not errors, errors
    return samples


def admitted(connect, most: int = 100) -> int:
    """How many sessions the server lets a client open now (all closed again)."""
    held = []
    try:
        while len(held) < most:
            try:
                held.append(connect())
            except Exception:
                break
        return len(held)
    finally:
        for c in held:
            c.close()


def settles_to_zero(probe, within: float = 5.0) -> bool:
    """The count falls back to 0 once the sessions closed (a backend takes a moment to exit)."""
    deadline = time.monotonic() + within
    while probe.busy() != 0:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def check_probe(probe, connect, limit: int, openers) -> None:
    """The probe's limit is what a client gets (sessions opened until the server refuses one) and
    `limit`; it counts exactly the SLEEPING sessions in a statement and the one in a transaction,
    not the IDLE ones (`openers`: sleeping, in_transaction, idle); then back to 0. Closes it."""
    sleeping, in_transaction, idle = openers
    try:
        assert probe.limit == admitted(connect)
        assert probe.limit == limit
        assert probe.busy() == 0
        samples = _count_while(probe, [sleeping] * SLEEPING + [in_transaction] + [idle] * IDLE)
        assert samples == [SLEEPING + 1] * 5, samples
        assert settles_to_zero(probe)
    finally:
        probe.close()


@needs_root("servers run as their own OS users")
def test_postgres_counts_statements_and_open_transactions_not_idle_sessions(tmp_path):
    import psycopg

    pg_bindir()
    with Postgres(Host.loopback(), free_port(), tmp_path / "pg", fsync=False, max_connections=20) as pg:
        pg.create_database("lab")

        def sleeping(ready, release):
            with psycopg.connect(pg.dsn("lab"), autocommit=True) as c:
                ready.wait()
                c.execute("select pg_sleep(2)")

        def in_transaction(ready, release):
            with psycopg.connect(pg.dsn("lab")) as c:  # not autocommit: the select opens a transaction
                c.execute("select 1")
                ready.wait()
                release.wait(20)
                c.rollback()

        def idle(ready, release):
            with psycopg.connect(pg.dsn("lab"), autocommit=True) as c:
                c.execute("select 1")
                ready.wait()
                release.wait(20)

        connect = lambda: psycopg.connect(pg.dsn("lab"), autocommit=True)  # noqa: E731
        # superuser_reserved_connections' default (3) and the probe's own session
        check_probe(pg.busy_sessions_probe(), connect, 20 - 3 - 1, [sleeping, in_transaction, idle])


@needs_root("servers run as their own OS users")
@pytest.mark.skipif(not os.path.exists("/usr/sbin/mariadbd"), reason="mariadb-server not installed")
def test_mariadb_counts_statements_and_open_transactions_not_idle_sessions(tmp_path):
    import pymysql

    with MariaDB(Host.loopback(), free_port(), tmp_path / "maria", durable=False, max_connections=20) as db:
        db.create_database("lab")
        with pymysql.connect(**db.connect_args("lab"), autocommit=True) as c, c.cursor() as cur:
            cur.execute("create table t (i int primary key) engine=InnoDB")

        def sleeping(ready, release):
            with pymysql.connect(**db.connect_args("lab"), autocommit=True) as c, c.cursor() as cur:
                ready.wait()
                cur.execute("select sleep(2)")

        def in_transaction(ready, release):
            with pymysql.connect(**db.connect_args("lab"), autocommit=False) as c, c.cursor() as cur:
                cur.execute("insert into t values (1)")  # an InnoDB transaction, open, its session asleep
                ready.wait()
                release.wait(20)
                c.rollback()

        def idle(ready, release):
            with pymysql.connect(**db.connect_args("lab"), autocommit=True) as c, c.cursor() as cur:
                cur.execute("select 1")
                ready.wait()
                release.wait(20)

        connect = lambda: pymysql.connect(**db.connect_args("lab"), autocommit=True)  # noqa: E731
        check_probe(db.busy_sessions_probe(), connect, 20 - 1, [sleeping, in_transaction, idle])  # the probe's session
