"""Replicas that cannot drift (issue 25 item 2): the Rust middleware's recovery log, end to end.

Two PostgreSQL servers behind `tierscope-engine middleware --recovery-log PATH`. Clients write
(transactions over the extended protocol, autocommit statements over the simple one) while
backend 2 is stopped; the middleware disables it and goes on. Backend 2 comes back stale; a new
middleware over both, with the same log, replays the missing units to it before it listens, so the
tables' checksums (md5 of their ordered contents) and the positions (`tierscope_recovery.seq`) are
equal on both servers the moment it serves, and reads are then balanced over both. Without the
log's units (a middleware given an empty log), the stale backend is refused with one message
naming it and both positions, and no read reaches it.
"""

from __future__ import annotations

import threading
import time

import pytest

import test_middleware
from conftest import needs_postgres, needs_root
from test_middleware import DB, fresh_table, on_each, seq_scans
from test_middleware_rust import dsn, engine_built, rust_middleware, wait_for_log  # noqa: F401  (engine_built: autouse)

#: this module's own pair of PostgreSQL servers (tests/test_middleware.py's fixture)
servers = test_middleware.pair

pytestmark = [needs_root("PostgreSQL runs as its own OS user"), needs_postgres]

ACCOUNTS = 50


def checksums(pgs) -> list[tuple]:
    """Per server: md5 of each table's ordered contents, sum of the balances, the position."""
    out = []
    for p in pgs:
        acc = p.sql("SELECT md5(string_agg(id || ':' || abalance, ',' ORDER BY id)), sum(abalance) FROM racc", DB)[0]
        hist = p.sql(
            "SELECT md5(coalesce(string_agg(id || ':' || aid || ':' || delta, ',' ORDER BY id), '')) FROM rhist", DB
        )
        seq = p.sql("SELECT seq FROM tierscope_recovery", DB)
        out.append((acc[0], int(acc[1]), hist[0][0], seq[0][0]))
    return out


def write_load(mw, stop: threading.Event, errors: list, counts: list, ids: bool = False) -> list[threading.Thread]:
    """Two writers through the middleware until `stop`: TPC-B-like transactions (extended
    protocol, parameters) and autocommit updates sent as simple queries (client-side binding).
    `ids`: the history rows get their ids from the writer, not from rhist's sequence."""
    import psycopg

    def transactions():
        try:
            with psycopg.connect(dsn(mw), autocommit=True) as conn:
                i = 0
                while not stop.is_set():
                    aid, delta = 1 + i % ACCOUNTS, (i * 7) % 11 - 5
                    with conn.transaction():
                        conn.execute("UPDATE racc SET abalance = abalance + %s WHERE id = %s", (delta, aid))
                        conn.execute("SELECT abalance FROM racc WHERE id = %s", (aid,)).fetchone()
                        if ids:
                            conn.execute("INSERT INTO rhist (id, aid, delta) VALUES (%s, %s, %s)", (i + 1, aid, delta))
                        else:
                            conn.execute("INSERT INTO rhist (aid, delta) VALUES (%s, %s)", (aid, delta))
                    counts[0] += 1
                    i += 1
        except Exception as err:  # reported by the test
            errors.append(err)

    def simple():
        try:
            with psycopg.connect(dsn(mw), autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
                i = 0
                while not stop.is_set():
                    # order-dependent (a doubling), kept within bigint by the modulus however many run
                    conn.execute(
                        "UPDATE racc SET abalance = (abalance * 2 - %s) %% 1000003 WHERE id = %s",
                        (i % 3, 1 + (i * 13) % ACCOUNTS),
                    )
                    counts[1] += 1
                    i += 1
        except Exception as err:
            errors.append(err)

    threads = [threading.Thread(target=transactions), threading.Thread(target=simple)]
    for t in threads:
        t.start()
    return threads


@pytest.mark.parametrize("scheduler", ["lock", "rows"])
def test_a_backend_that_was_down_is_replayed_to_the_head_before_it_serves(servers, scheduler):
    import psycopg

    work, pgs = servers
    log_path = work / f"recovery-1-{scheduler}" / "recovery.log"
    fresh_table(pgs, "probe_rec")
    for p in pgs:
        p.sql("DROP TABLE IF EXISTS racc, rhist, tierscope_recovery", DB)
    recovery = ["--recovery-log", str(log_path), "--scheduler", scheduler]
    errors: list = []
    counts = [0, 0]
    stats1: dict = {}
    try:
        with rust_middleware(servers, "rr", stats=stats1, extra=recovery) as mw:
            with psycopg.connect(dsn(mw), autocommit=True) as conn:
                # the schema and the data through the middleware: logged like any write
                conn.execute("CREATE TABLE racc (id int PRIMARY KEY, abalance bigint NOT NULL)")
                conn.execute("CREATE TABLE rhist (id serial PRIMARY KEY, aid int, delta int)")
                conn.execute(f"INSERT INTO racc SELECT g, 0 FROM generate_series(1, {ACCOUNTS}) g")
            stop = threading.Event()
            threads = write_load(mw, stop, errors, counts)
            time.sleep(1.0)
            before_stop = list(counts)
            pgs[1].stop()  # backend 2 goes away; the writes go on on backend 1
            time.sleep(1.5)
            stop.set()
            for t in threads:
                t.join(timeout=30)
        assert not errors, errors
        assert counts[0] > before_stop[0] + 5 and counts[1] > before_stop[1] + 5, (before_stop, counts)
        assert stats1["disabled"] == [pgs[1].address]
    finally:
        pgs[1].start()
    stale = checksums(pgs)
    assert stale[0] != stale[1] and stale[1][3] < stale[0][3]  # backend 2 is behind, by its position too
    assert log_path.stat().st_size > 0

    stats2: dict = {}
    with rust_middleware(servers, "rr", stats=stats2, extra=recovery) as mw:
        text = mw.log.read_text()
        refusals = [line for line in text.splitlines() if "REFUSED" in line]
        now = checksums(pgs)
        before = seq_scans(pgs, "probe_rec", 0)
        with psycopg.connect(dsn(mw), autocommit=True) as conn:
            for _ in range(6):
                assert conn.execute("SELECT count(*) FROM probe_rec").fetchone() == (3,)
            conn.execute("UPDATE racc SET abalance = abalance + 1")
    after = seq_scans(pgs, "probe_rec", sum(before) + 6)
    rec = stats2["recovery"]
    assert rec["positions_at_start"][pgs[1].address] == stale[1][3]
    assert now[0][:3] == stale[0][:3]  # nothing lost from backend 1
    print(f"recovery: backend 2 {'refused' if refusals else 'replayed'} ({rec})")  # seen with -s
    if refusals:
        # the one case the replay cannot mend: backend 2 went down inside a transaction that had
        # taken sequence values (not transactional), so the replayed rows got other numbers: it is
        # refused, with one message, and never read nor written
        assert len(refusals) == 1 and pgs[1].address in refusals[0], text
        assert "sequences differ" in refusals[0] and "rhist_id_seq" in refusals[0], refusals[0]
        assert [a - b for a, b in zip(after, before)] == [6, 0]
        assert stats2["disabled"] == [pgs[1].address]
        assert pgs[1].sql("SELECT seq FROM tierscope_recovery", DB) == [(-1,)]  # refused at every start
        return
    # listening: backend 2 was brought to the head first (the checksums were taken before any query)
    assert now[0] == now[1], now
    assert "replayed from" in text
    assert [a - b for a, b in zip(after, before)] == [3, 3]  # both replicas serve again
    assert stats2["disabled"] == []
    assert rec["replayed"][pgs[1].address]["units"] >= 1
    end = checksums(pgs)
    assert end[0] == end[1] and end[0][1] == stale[0][1] + ACCOUNTS  # and take writes alike
    assert rec["head_at_start"] >= stale[0][3]


@pytest.mark.parametrize("scheduler", ["lock", "rows"])
def test_a_backend_that_comes_back_while_serving_rejoins_at_the_head_and_is_never_read_stale(servers, scheduler):
    """The middleware keeps serving while backend 2 is down and comes back: it tries it again every
    second and, once the log has brought it to the head under the write lock, serves from it again.
    A reader counts the history rows through the middleware the whole time: a read from a stale
    backend would see fewer rows than an earlier read did (the rows only grow, and a read waits for
    the writes started before it on its backend). The history ids come from the writer: a
    sequence value taken by a transaction cut by the stop is the case the log cannot mend (the
    next test)."""
    import psycopg

    work, pgs = servers
    log_path = work / f"recovery-3-{scheduler}" / "recovery.log"
    fresh_table(pgs, "probe_rej")
    for p in pgs:
        p.sql("DROP TABLE IF EXISTS racc, rhist, tierscope_recovery", DB)
    errors: list = []
    counts = [0, 0]
    seen: list[int] = []
    stats: dict = {}
    stop, stop_reader = threading.Event(), threading.Event()

    def reader(mw):
        try:
            with psycopg.connect(dsn(mw), autocommit=True) as conn:
                while not stop_reader.is_set():
                    seen.append(conn.execute("SELECT count(*) FROM rhist").fetchone()[0])
        except Exception as err:
            errors.append(err)

    try:
        with rust_middleware(
            servers, "rr", stats=stats, extra=["--recovery-log", str(log_path), "--scheduler", scheduler]
        ) as mw:
            with psycopg.connect(dsn(mw), autocommit=True) as conn:
                conn.execute("CREATE TABLE racc (id int PRIMARY KEY, abalance bigint NOT NULL)")
                conn.execute("CREATE TABLE rhist (id int PRIMARY KEY, aid int, delta int)")
                conn.execute(f"INSERT INTO racc SELECT g, 0 FROM generate_series(1, {ACCOUNTS}) g")
            threads = write_load(mw, stop, errors, counts, ids=True)
            threads.append(threading.Thread(target=reader, args=(mw,)))
            threads[-1].start()
            time.sleep(1.0)
            pgs[1].stop()  # down: disabled at its next read or write; the rest goes on
            wait_for_log(mw, "DISABLED", 20)
            time.sleep(1.0)
            behind = list(counts)
            pgs[1].start()  # back, stale, while the middleware serves
            wait_for_log(mw, "REJOINED", 30)
            rejoined_at = len(seen)
            time.sleep(1.5)
            stop.set()
            for t in threads[:-1]:
                t.join(timeout=30)
            stop_reader.set()
            threads[-1].join(timeout=30)
            # served by both again
            before = seq_scans(pgs, "probe_rej", 0)
            with psycopg.connect(dsn(mw), autocommit=True) as conn:
                for _ in range(6):
                    assert conn.execute("SELECT count(*) FROM probe_rej").fetchone() == (3,)
            after = seq_scans(pgs, "probe_rej", sum(before) + 6)
            text = mw.log.read_text()
    finally:
        if not pgs[1].running():
            pgs[1].start()
    assert not errors, errors
    assert counts[0] > behind[0] + 3 and counts[1] > behind[1] + 3, (behind, counts)  # writes after it
    # never a stale read: the history rows the reader saw never went down, before, during or after
    assert len(seen) > rejoined_at > 10 and all(a <= b for a, b in zip(seen, seen[1:])), seen
    rejoin_line = next(line for line in text.splitlines() if "REJOINED" in line)
    assert pgs[1].address in rejoin_line and "units replayed" in rejoin_line, rejoin_line
    assert int(rejoin_line.split("REJOINED: ")[1].split(" units")[0]) >= 1  # it had missed writes
    assert [a - b for a, b in zip(after, before)] == [3, 3]
    assert stats["disabled"] == [] and stats["backends"][1]["rejoined"] == 1, stats["backends"]
    end = checksums(pgs)
    assert end[0] == end[1], end  # the same tables and the same position on both


def test_a_backend_whose_return_the_log_cannot_mend_is_refused_for_good_and_never_read(servers):
    """Backend 2 goes down inside a transaction that took a sequence value there (not
    transactional: kept by the crash); the transaction commits on backend 1. When backend 2 comes
    back, the replay gives the row another id, its sequence differs from backend 1's: it is refused
    for good, with one message naming it, and never read nor written."""
    import psycopg

    work, pgs = servers
    fresh_table(pgs, "probe_ret")
    for p in pgs:
        p.sql("DROP TABLE IF EXISTS racc, rhist, tierscope_recovery", DB)
    stats: dict = {}
    try:
        # wait="all": the first INSERT has taken its sequence value on backend 2 before it stops
        with rust_middleware(
            servers, "rr", wait="all", stats=stats, extra=["--recovery-log", str(work / "recovery-4" / "recovery.log")]
        ) as mw:
            with psycopg.connect(dsn(mw), autocommit=True) as conn:
                conn.execute("CREATE TABLE rhist (id serial PRIMARY KEY, aid int, delta int)")
                with conn.transaction():
                    conn.execute("INSERT INTO rhist (aid, delta) VALUES (1, 1)")  # nextval on both
                    pgs[1].stop()  # backend 2 rolls it back; its sequence keeps the value
                    conn.execute("INSERT INTO rhist (aid, delta) VALUES (2, 2)")  # backend 1 only
                pgs[1].start()
                wait_for_log(mw, "REFUSED on its return", 30)
                before = seq_scans(pgs, "probe_ret", 0)
                for _ in range(6):
                    assert conn.execute("SELECT count(*) FROM probe_ret").fetchone() == (3,)
                conn.execute("INSERT INTO rhist (aid, delta) VALUES (3, 3)")
                time.sleep(1.5)  # more rejoin rounds: a refused backend is not tried again
            text = mw.log.read_text()
    finally:
        if not pgs[1].running():
            pgs[1].start()
    after = seq_scans(pgs, "probe_ret", sum(before) + 6)
    refusals = [line for line in text.splitlines() if "REFUSED" in line]
    assert len(refusals) == 1 and pgs[1].address in refusals[0], text
    assert "sequences differ" in refusals[0] and "rhist_id_seq" in refusals[0], refusals[0]
    assert "REJOINED" not in text
    assert [a - b for a, b in zip(after, before)] == [6, 0]  # never read
    assert stats["disabled"] == [pgs[1].address] and stats["backends"][1]["rejoined"] == 0
    assert on_each(pgs, "SELECT count(*) FROM rhist WHERE aid = 3") == [[(1,)], [(0,)]]  # nor written
    assert pgs[1].sql("SELECT seq FROM tierscope_recovery", DB) == [(-1,)]  # refused at every start too


def test_a_stale_backend_the_log_cannot_bring_back_is_refused_and_never_read(servers):
    import psycopg

    work, pgs = servers
    fresh_table(pgs, "probe_ref")
    for p in pgs:
        p.sql("DROP TABLE IF EXISTS racc, rhist, tierscope_recovery", DB)
    first = ["--recovery-log", str(work / "recovery-2a" / "recovery.log")]
    try:
        # wait="all": the schema and rows are on backend 2 before it stops (with "first" the stop
        # could abort the INSERT there, which is issue 25 item 2's other case, not this one)
        with (
            rust_middleware(servers, "rr", wait="all", extra=first) as mw,
            psycopg.connect(dsn(mw), autocommit=True) as conn,
        ):
            conn.execute("CREATE TABLE racc (id int PRIMARY KEY, abalance bigint NOT NULL)")
            conn.execute("CREATE TABLE rhist (id serial PRIMARY KEY, aid int, delta int)")
            conn.execute(f"INSERT INTO racc SELECT g, 0 FROM generate_series(1, {ACCOUNTS}) g")
            pgs[1].stop()
            for i in range(5):
                conn.execute("UPDATE racc SET abalance = abalance + 1 WHERE id = %s", (i + 1,))
    finally:
        pgs[1].start()
    positions = [p.sql("SELECT seq FROM tierscope_recovery", DB)[0][0] for p in pgs]
    assert positions[1] < positions[0]
    # a new middleware with another (empty) log: the units backend 2 misses are nowhere
    stats: dict = {}
    before = seq_scans(pgs, "probe_ref", 0)
    with rust_middleware(
        servers, "rr", stats=stats, extra=["--recovery-log", str(work / "recovery-2b" / "recovery.log")]
    ) as mw:
        text = mw.log.read_text()
        refusals = [line for line in text.splitlines() if "REFUSED" in line]
        assert len(refusals) == 1, text
        assert pgs[1].address in refusals[0]
        assert f"its position is {positions[1]}, the head is {positions[0]}" in refusals[0]
        with psycopg.connect(dsn(mw), autocommit=True) as conn:
            for _ in range(6):
                assert conn.execute("SELECT count(*) FROM probe_ref").fetchone() == (3,)
            conn.execute("UPDATE racc SET abalance = abalance + 1 WHERE id = 1")
    after = seq_scans(pgs, "probe_ref", sum(before) + 6)
    assert [a - b for a, b in zip(after, before)] == [6, 0]  # the stale one is never read
    assert stats["disabled"] == [pgs[1].address]
    assert "REFUSED" in stats["backends"][1]["disabled_reason"]
    # nor written: backend 2 is as it was
    assert [p.sql("SELECT seq FROM tierscope_recovery", DB)[0][0] for p in pgs][1] == positions[1]
    assert on_each(pgs, "SELECT abalance FROM racc WHERE id = 1") == [[(2,)], [(0,)]]


def test_the_labs_middleware_gets_a_recovery_log_in_its_work_directory(tmp_path):
    """Issue 25 item 2: lab runs get replicas that cannot drift: the lab's service passes
    `--recovery-log` with a path in its work directory (PostgreSQL protocol; the MySQL side keeps
    none: tests/test_middleware_rust_mysql.py)."""
    from tierscope.services.middleware import Middleware
    from tierscope.testbed.host import Host

    mw = Middleware(
        Host.loopback("mw"),
        25999,
        tmp_path / "mw",
        backends=["127.0.0.1:5433", "127.0.0.1:5434"],
        database="lab",
        user="lab",
        password="secret",
    )
    cmd = mw.command()
    argv = cmd[cmd.index("--listen") - 1 :]  # past a root lab's run_as wrapper
    assert argv[argv.index("--recovery-log") + 1] == str(tmp_path / "mw" / "middleware.recovery.log")
    assert "--scheduler" not in argv  # the default, the one write lock


def test_the_labs_middleware_takes_the_row_scheduler_from_the_spec(tmp_path):
    """`soft.middleware.scheduler = "rows"` reaches the lab's middleware (beside its recovery log);
    a scheduler it does not know is refused by name."""
    from tierscope.services.middleware import Middleware
    from tierscope.spec import expand, parse_spec
    from tierscope.testbed.host import Host

    (point,) = expand(
        parse_spec('topology = "1/1/1/2"\n[workload]\nusers = [10]\n[soft.middleware]\nscheduler = "rows"\n')
    )
    soft = point.config.soft.middleware
    assert soft.scheduler == "rows"
    kw = dict(backends=["127.0.0.1:5433", "127.0.0.1:5434"], database="lab", user="lab", password="secret")
    mw = Middleware(Host.loopback("mw"), 25999, tmp_path / "mw", scheduler=soft.scheduler, **kw)
    cmd = mw.command()
    argv = cmd[cmd.index("--listen") - 1 :]
    assert argv[argv.index("--scheduler") + 1] == "rows" and "--recovery-log" in argv
    with pytest.raises(ValueError, match="middleware scheduler: expected lock or rows, got 'table'"):
        Middleware(Host.loopback("mw"), 25999, tmp_path / "mw", scheduler="table", **kw)
