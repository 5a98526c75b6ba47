"""The app server's connections taken from its pools (`contracts.poolgauge`): what each process
holds or waits for, at most its pool's size, summed over the live ones; a connection held between
statements counted, which the database's own view (busy sessions) does not count; a connection
passed from one request to the next never read as free.

Ground truth: the sessions the test itself holds open or waits for.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from conftest import needs_postgres
from tierscope.contracts import poolgauge
from tierscope.services.appserver import PoolInUse


def test_the_gauge_sums_the_live_processes_and_forgets_the_dead(tmp_path):
    g = poolgauge.PoolGauge(tmp_path)
    threads = [threading.Thread(target=g.add, args=(1,)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    g.add(-1)
    assert poolgauge.in_use(tmp_path) == 2
    r, w = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:  # a worker forked after its parent made the gauge: a file of its own
        try:
            g.add(1)
            g.add(1)
            g.add(1)
            os.write(w2, b"x")
            os.read(r, 1)
        finally:
            os._exit(0)
    assert os.read(r2, 1) == b"x"
    try:
        assert sorted(f.name for f in tmp_path.iterdir()) == sorted([str(os.getpid()), str(pid)])
        assert poolgauge.in_use(tmp_path) == 5
    finally:
        os.write(w, b"x")
        os.waitpid(pid, 0)
    assert poolgauge.in_use(tmp_path) == 2  # the child is gone: its 3 no longer count
    probe = PoolInUse(tmp_path, limit=8)
    assert (probe.busy(), probe.limit) == (2, 8)


def test_the_gauge_counts_at_most_the_pools_size(tmp_path):
    g = poolgauge.PoolGauge(tmp_path, limit=2)
    for _ in range(3):  # two holding, one queued: the pool's two are taken, no more
        g.add(1)
    assert poolgauge.in_use(tmp_path) == 2
    g.add(-1)
    assert poolgauge.in_use(tmp_path) == 2  # the one queued got the connection given back
    g.add(-1)
    assert poolgauge.in_use(tmp_path) == 1


@pytest.fixture
def gauged_pg(tmp_path, monkeypatch):
    """A PostgreSQL server, and the gauge directory this process' pools write to."""
    from tierscope.services.base import free_port
    from tierscope.services.postgres import Postgres
    from tierscope.testbed.host import Host

    gauge = tmp_path / "gauge"
    gauge.mkdir()
    monkeypatch.setenv(poolgauge.ENV, str(gauge))
    with Postgres(Host.loopback(), free_port(), tmp_path / "pg", fsync=False, max_connections=20) as pg:
        yield pg, gauge


def _database(pg, pool_size: int):
    from tierscope.apps.dal import Database
    from tierscope.contracts.dbms import DbConfig

    c = pg.credentials
    return Database(
        DbConfig(
            host=pg.host.address,
            port=pg.port,
            user=c.user,
            password=c.password,
            database="postgres",
            pool_size=pool_size,
        )
    )


@needs_postgres
def test_a_connection_passed_to_a_queued_request_is_never_free(gauged_pg):
    pg, gauge = gauged_pg
    db = _database(pg, pool_size=1)
    try:
        first_holds, release_first, last_holds = threading.Event(), threading.Event(), threading.Event()
        holders = []

        def first():
            with db.session() as s:
                s.query("SELECT 1")
                first_holds.set()
                release_first.wait(10)

        def queued():
            with db.session() as s:
                s.query("SELECT 1")
                holders.append(1)
                if len(holders) == 2:  # the last request wanting the connection has it
                    last_holds.set()

        a = threading.Thread(target=first)
        a.start()
        assert first_holds.wait(10)
        waiting = [threading.Thread(target=queued) for _ in range(2)]
        for t in waiting:
            t.start()
        deadline = time.monotonic() + 5
        while db._impl.pool.get_stats().get("requests_waiting", 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert db._impl.pool.get_stats().get("requests_waiting", 0) == 2
        assert poolgauge.in_use(gauge) == 1  # one holding, two queued: the pool's one is taken
        # the connection passes from the first request to the two queued ones in turn; sampled
        # throughout (the sampling also holds the interpreter's lock, which each next holder
        # needs to return from the pool), it never reads as free while a request wants it
        release_first.set()
        samples = []
        while len(samples) < 1_000_000:
            n = poolgauge.in_use(gauge)
            if last_holds.is_set():  # read perhaps after the last request gave it back
                break
            samples.append(n)
        a.join(10)
        for t in waiting:
            t.join(10)
        assert len(holders) == 2
        assert samples and min(samples) == 1, (len(samples), samples.count(0))
        assert poolgauge.in_use(gauge) == 0
    finally:
        db.close()


@needs_postgres
def test_a_connection_held_between_statements_is_in_use_though_the_database_sees_it_idle(gauged_pg):
    pg, gauge = gauged_pg
    db = _database(pg, pool_size=3)
    probe = pg.busy_sessions_probe()
    try:
        held, release = threading.Barrier(3), threading.Event()

        def page():
            with db.session() as s:
                s.query("SELECT 1")  # one statement, then the app works on with the connection
                held.wait()
                release.wait(10)

        ts = [threading.Thread(target=page) for _ in range(2)]
        for t in ts:
            t.start()
        held.wait()
        try:
            in_use, busy = poolgauge.in_use(gauge), probe.busy()
        finally:
            release.set()
            for t in ts:
                t.join()
        assert in_use == 2
        assert busy == 0  # between statements: idle to the database
        assert poolgauge.in_use(gauge) == 0
    finally:
        probe.close()
        db.close()


if __name__ == "__main__":
    pytest.main([__file__])
