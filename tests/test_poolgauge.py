"""The app server's connections checked out of its pools (`contracts.poolgauge`): what each process
holds, summed over the live ones, and a connection held between statements counted, which the
database's own view (busy sessions) does not count.

Ground truth: the sessions the test itself holds open.
"""

from __future__ import annotations

import os
import threading

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


@needs_postgres
def test_a_connection_held_between_statements_is_in_use_though_the_database_sees_it_idle(tmp_path, monkeypatch):
    from tierscope.apps.dal import Database
    from tierscope.contracts.dbms import DbConfig
    from tierscope.services.base import free_port
    from tierscope.services.postgres import Postgres
    from tierscope.testbed.host import Host

    gauge = tmp_path / "gauge"
    gauge.mkdir()
    monkeypatch.setenv(poolgauge.ENV, str(gauge))
    with Postgres(Host.loopback(), free_port(), tmp_path / "pg", fsync=False, max_connections=20) as pg:
        c = pg.credentials
        db = Database(
            DbConfig(
                host=pg.host.address, port=pg.port, user=c.user, password=c.password, database="postgres", pool_size=3
            )
        )
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
