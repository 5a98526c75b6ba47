"""The Rust middleware's row scheduler (`--scheduler rows`, issue 25 item 3) on real PostgreSQL.

Write transactions whose rows differ run side by side; the rows a unit writes come from its SQL
(engine/src/middleware/scope.rs, cases in engine/tests/sql_cases.json) and the tables' facts in the
catalog. Ground truth: pgbench's own transaction count, each server read directly (every table's
checksum equal on both, TPC-B's balances equal to its history by arithmetic), and timing a second
session against a first one's open transaction (waits where rows meet, not where they do not).
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time

import pytest

import test_middleware
from conftest import needs_postgres, needs_root
from test_middleware import DB, on_each
from test_middleware_rust import dsn, pgbench_exe, pgbench_init, rust_middleware

#: this module's own pair of PostgreSQL servers (tests/test_middleware.py's fixture)
servers = test_middleware.pair

pytestmark = [needs_root("PostgreSQL runs as its own OS user"), needs_postgres]

ROWS = ("--scheduler", "rows")


def table_checksums(pgs, tables) -> list[dict]:
    """Per server, each table's row count and md5 of its rows in a fixed order."""
    out = []
    for p in pgs:
        sums = {}
        for t in tables:
            q = f"SELECT count(*), md5(coalesce(string_agg(x::text, ',' ORDER BY x::text), '')) FROM {t} x"
            sums[t] = p.sql(q, DB)[0]
        out.append(sums)
    return out


def keyed_table(pgs, name: str, n: int = 3) -> None:
    for p in pgs:
        p.sql(f"DROP TABLE IF EXISTS {name}", DB)
        p.sql(f"CREATE TABLE {name} (id int PRIMARY KEY, v int NOT NULL)", DB)
        p.sql(f"INSERT INTO {name} SELECT g, 0 FROM generate_series(1, {n}) g", DB)


def in_thread(fn) -> tuple[threading.Event, list]:
    """Run `fn` in a thread: an event set when it returns, and a list that gets its error."""
    done, errors = threading.Event(), []

    def run():
        try:
            fn()
        except Exception as e:  # noqa: BLE001 (handed to the test)
            errors.append(e)
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    return done, errors


def test_different_rows_run_side_by_side_and_the_same_row_waits(servers):
    """A transaction holding row 1 (uncommitted) does not hold up another's write of row 2, which
    commits at once; a third session's write of row 1 waits for the first one's COMMIT. Under the one
    write lock (`--scheduler lock`) the write of row 2 waits too: the check that tells them apart."""
    import psycopg

    _, pgs = servers
    for scheduler, row2_waits in (("rows", False), ("lock", True)):
        keyed_table(pgs, "rside")
        stats: dict = {}
        with (
            rust_middleware(servers, "lprf", stats=stats, extra=("--scheduler", scheduler)) as mw,
            psycopg.connect(dsn(mw)) as a,
            psycopg.connect(dsn(mw), autocommit=True) as b,
            psycopg.connect(dsn(mw), autocommit=True) as c,
        ):
            a.execute("UPDATE rside SET v = v + 1 WHERE id = 1")  # a's transaction holds row 1
            row2, err2 = in_thread(lambda: b.execute("UPDATE rside SET v = v + 10 WHERE id = 2"))
            row1, err1 = in_thread(lambda: c.execute("UPDATE rside SET v = v * 100 WHERE id = 1"))
            try:
                assert row2.wait(0.8) != row2_waits, f"{scheduler}: row 2's write {'went' if row2_waits else 'waited'}"
                assert not row1.wait(0.5), f"{scheduler}: row 1's write did not wait for a's transaction"
            finally:
                a.commit()
            assert row1.wait(10) and row2.wait(10) and not err1 and not err2, (err1, err2)
        # row 1: a's +1 then c's *100 (in that order on both servers); row 2: +10
        assert on_each(pgs, "SELECT id, v FROM rside ORDER BY id") == [[(1, 100), (2, 10), (3, 0)]] * 2, scheduler
        assert stats["disabled"] == [] and stats["scheduler"]["name"] == scheduler
        if scheduler == "rows":
            # a's UPDATE and COMMIT, b's and c's UPDATEs: three units of one row, one shared (COMMIT)
            s = stats["scheduler"]
            assert (s["row_units"], s["shared_units"], s["database_units"]) == (3, 1, 0), s
            assert s["waits"] >= 1 and s["deadlocks"] == 0 and s["facts_read"] >= 1, s


def test_a_write_the_scheduler_cannot_scope_waits_for_every_open_transaction(servers):
    """An UPDATE of every row (no key in its WHERE) holds the whole database: it waits for a
    transaction that holds one row, and a new transaction's keyed write waits behind it."""
    import psycopg

    _, pgs = servers
    keyed_table(pgs, "rwhole")
    stats: dict = {}
    with (
        rust_middleware(servers, "lprf", stats=stats, extra=ROWS) as mw,
        psycopg.connect(dsn(mw)) as a,
        psycopg.connect(dsn(mw), autocommit=True) as b,
        psycopg.connect(dsn(mw), autocommit=True) as c,
    ):
        a.execute("UPDATE rwhole SET v = 5 WHERE id = 3")
        whole, errw = in_thread(lambda: b.execute("UPDATE rwhole SET v = v * 2"))
        try:
            assert not whole.wait(0.8), "the UPDATE of every row did not wait for the open transaction"
            late, errl = in_thread(lambda: c.execute("UPDATE rwhole SET v = v + 1 WHERE id = 2"))
            assert not late.wait(0.5), "a new transaction went ahead of the write waiting for the database"
        finally:
            a.commit()
        assert whole.wait(10) and late.wait(10) and not errw and not errl, (errw, errl)
    # a's v = 5, then every row doubled, then row 2 + 1: the same order on both servers
    assert on_each(pgs, "SELECT id, v FROM rwhole ORDER BY id") == [[(1, 0), (2, 1), (3, 10)]] * 2
    assert stats["scheduler"]["database_units"] == 1 and stats["disabled"] == []


def test_a_deadlock_between_two_transactions_is_broken_with_40P01(servers):
    """a holds row 1 and waits for row 2; b holds row 2 and asks for row 1: the middleware fails
    b's statement with 40P01 at once (PostgreSQL's own detector would wait deadlock_timeout, 1 s),
    b rolls back, a goes on and commits. Both servers end with a's writes only."""
    import psycopg

    _, pgs = servers
    keyed_table(pgs, "rdead")
    stats: dict = {}
    with (
        rust_middleware(servers, "lprf", stats=stats, extra=ROWS) as mw,
        psycopg.connect(dsn(mw)) as a,
        psycopg.connect(dsn(mw)) as b,
    ):
        a.execute("UPDATE rdead SET v = 1 WHERE id = 1")
        b.execute("UPDATE rdead SET v = 2 WHERE id = 2")
        a_done, a_err = in_thread(lambda: a.execute("UPDATE rdead SET v = 1 WHERE id = 2"))
        assert not a_done.wait(0.5), "a's write of row 2 did not wait for b"
        t0 = time.monotonic()
        with pytest.raises(psycopg.errors.DeadlockDetected) as err:
            b.execute("UPDATE rdead SET v = 2 WHERE id = 1")
        assert time.monotonic() - t0 < 0.9, "not the middleware's detector"
        assert "tierscope middleware" in (err.value.diag.message_detail or "")
        # b's transaction failed on both servers: a COMMIT now rolls it back, as PostgreSQL's would
        b.rollback()
        assert a_done.wait(10) and not a_err, a_err
        a.commit()
    assert on_each(pgs, "SELECT id, v FROM rdead ORDER BY id") == [[(1, 1), (2, 1), (3, 0)]] * 2
    assert stats["scheduler"]["deadlocks"] == 1 and stats["disabled"] == []


def test_pgbench_tpcb_side_by_side_keeps_every_table_identical(servers):
    """pgbench's TPC-B-like script, 4 clients, in each protocol mode, through the row scheduler:
    pgbench's count of transactions is what it asked for; on each server the balances of accounts,
    tellers and branches all equal the history's sum of deltas (every transaction's four writes
    landed together), and every table's checksum is the same on both servers. Each transaction's
    three UPDATEs are keyed (no unit holds the database), and the one branch row is where they wait.
    The pool (3 connections per server) is smaller than the clients (4): transactions wait for
    connections too, and never hold some while another holds the rest."""
    _, pgs = servers
    pgbench = pgbench_exe()
    pgbench_init(pgs, pgbench)
    stats: dict = {}
    per_mode, clients = 60, 4
    with rust_middleware(servers, "lprf", stats=stats, extra=ROWS, pool=3) as mw:
        done = 0
        for mode in ("simple", "extended", "prepared"):
            out = subprocess.run(
                [str(pgbench), "-h", mw.host, "-p", str(mw.port), "-U", mw.user, "-n", "-c", str(clients)]
                + ["-t", str(per_mode), "-M", mode, DB],
                capture_output=True,
                text=True,
                timeout=180,
                env={**os.environ, "PGPASSWORD": mw.password},
            )
            assert out.returncode == 0, out.stdout + out.stderr
            done += int(re.search(r"number of transactions actually processed: (\d+)", out.stdout).group(1))
    assert done == 3 * per_mode * clients
    for rows in on_each(
        pgs,
        "SELECT (SELECT sum(abalance) FROM pgbench_accounts), (SELECT sum(tbalance) FROM pgbench_tellers),"
        " (SELECT sum(bbalance) FROM pgbench_branches), (SELECT sum(delta) FROM pgbench_history),"
        " (SELECT count(*) FROM pgbench_history)",
    ):
        a, t, b, h, n = rows[0]
        assert a == t == b == h and n == done, rows
    sums = table_checksums(pgs, ("pgbench_accounts", "pgbench_tellers", "pgbench_branches", "pgbench_history"))
    assert sums[0] == sums[1]
    s = stats["scheduler"]
    assert stats["disabled"] == [] and s["deadlocks"] == 0
    assert s["database_units"] == 0 and s["row_units"] == 3 * done, s


def test_the_row_scheduler_is_refused_where_it_cannot_keep_replicas_identical(tmp_path):
    """With the MySQL protocol the command line refuses `--scheduler rows` with a message saying
    why (exit status 2), before listening anywhere."""
    from tierscope.contracts.middleware import PASSWORD_ENV, SCHEDULERS
    from tierscope.engine import engine_path

    assert set(SCHEDULERS) == {"lock", "rows"}
    base = [str(engine_path()), "middleware", "--listen", "127.0.0.1:1", "--backend", "127.0.0.1:2", *ROWS]
    out = subprocess.run(
        [*base, "--protocol", "mysql", "--recovery-log", str(tmp_path / "r.log")],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, PASSWORD_ENV: "pw"},
    )
    assert out.returncode == 2 and "--scheduler rows: expected --protocol postgres" in out.stderr, out.stderr
    assert not (tmp_path / "r.log").exists()


def random_transactions(mw, clients: int, per_client: int, progress=None) -> tuple[int, int, list]:
    """`clients` clients through `mw`, each `per_client` transactions of one to three writes to
    random rows of rmix's eight (each write an operation that does not commute with the others:
    x3+1 mod a prime, negate, add), now and then a keyless INSERT into rmix_log, an UPDATE of every
    row (the whole database) or a DELETE and re-INSERT by key, in random order (seeded). A client
    that gets 40P01 rolls back and goes on. `progress(done)` is called after each transaction
    ended. Returns the commits, the deadlocks and the other errors."""
    import random

    import psycopg

    ops = ("v = (v * 3 + 1) %% 1000003", "v = -v", "v = v + {k}")
    deadlocks, errors, commits = [0], [], [0]
    lock = threading.Lock()

    def client(who: int) -> None:
        rnd = random.Random(who)
        with psycopg.connect(dsn(mw)) as conn:
            for n in range(per_client):
                try:
                    r = rnd.random()
                    if r < 0.04:
                        conn.execute("UPDATE rmix SET v = v + 7")  # the whole database
                    elif r < 0.08:
                        k = rnd.randint(1, 8)
                        conn.execute("DELETE FROM rmix WHERE id = %s", (k,))
                        conn.execute("INSERT INTO rmix VALUES (%s, %s)", (k, n))
                    for _ in range(rnd.randint(1, 3)):
                        op = rnd.choice(ops).format(k=rnd.randint(1, 9))
                        conn.execute(f"UPDATE rmix SET {op} WHERE id = %s", (rnd.randint(1, 8),))
                    if rnd.random() < 0.3:
                        conn.execute("INSERT INTO rmix_log VALUES (%s, %s, 'x')", (who, n))
                    conn.commit()
                    with lock:
                        commits[0] += 1
                except psycopg.errors.DeadlockDetected:
                    conn.rollback()
                    with lock:
                        deadlocks[0] += 1
                except Exception as e:  # noqa: BLE001 (any other error fails the test)
                    errors.append(repr(e))
                    conn.rollback()
                if progress is not None:
                    progress(commits[0] + deadlocks[0] + len(errors))

    threads = [threading.Thread(target=client, args=(w,)) for w in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not any(t.is_alive() for t in threads), "a client hung"
    return commits[0], deadlocks[0], errors


def random_tables(pgs) -> None:
    keyed_table(pgs, "rmix", 8)
    for p in pgs:
        p.sql("DROP TABLE IF EXISTS rmix_log", DB)
        p.sql("CREATE TABLE rmix_log (who int, n int, v text)", DB)


def test_random_transactions_that_do_not_commute_leave_the_replicas_identical(servers):
    """Six clients, 120 random transactions each (`random_transactions`). Deadlocks are expected
    (the row order is random); any other error fails the test. Both servers end with the same rows
    in every table, no backend disabled, and the middleware counted exactly the deadlocks the
    clients saw."""
    _, pgs = servers
    random_tables(pgs)
    stats: dict = {}
    with rust_middleware(servers, "lprf", stats=stats, extra=ROWS, pool=8) as mw:
        commits, deadlocks, errors = random_transactions(mw, 6, 120)
    assert errors == [], errors[:5]
    assert commits + deadlocks == 6 * 120
    sums = table_checksums(pgs, ("rmix", "rmix_log"))
    assert sums[0] == sums[1], sums
    s = stats["scheduler"]
    assert stats["disabled"] == [] and s["deadlocks"] == deadlocks, (s, deadlocks)
    assert s["row_units"] > 0 and s["database_units"] > 0 and s["waits"] > 0, s
    print(f"commits {commits}, deadlocks {deadlocks}, scheduler {s}")


def test_a_backend_back_from_a_stop_rejoins_from_a_log_of_whole_transactions(servers, tmp_path):
    """The random transactions with a recovery log (the lab's middleware always keeps one): a
    transaction holding rows goes to the log as one record when it commits, the commits one at a
    time in the log's order, its body side by side with the others'. Backend 2 is stopped a third
    of the way in and started again: the middleware disables it, goes on with backend 1, and once
    backend 2 answers replays the records it missed (transactions that do not commute, in their
    commit order) before it serves again. Both servers end with the same rows and the same
    position; a new middleware over both finds them at the head (nothing to replay)."""
    from test_middleware_rust import wait_for_log

    _, pgs = servers
    random_tables(pgs)
    for p in pgs:
        p.sql("DROP TABLE IF EXISTS tierscope_recovery", DB)
    recovery = ("--recovery-log", str(tmp_path / "recovery.log"))
    stats: dict = {}
    stopped = threading.Event()

    def progress(done: int) -> None:
        if done >= 200 and not stopped.is_set():
            stopped.set()
            pgs[1].stop()

    try:
        with rust_middleware(servers, "lprf", stats=stats, extra=ROWS + recovery, pool=8) as mw:
            result: list = []
            load = threading.Thread(target=lambda: result.append(random_transactions(mw, 6, 120, progress)))
            load.start()
            assert stopped.wait(120), "the load did not get a third of the way"
            wait_for_log(mw, "DISABLED", 30)
            pgs[1].start()  # back, stale, while the transactions go on
            wait_for_log(mw, "REJOINED", 60)
            load.join(timeout=240)
            assert result, "the load did not finish"
            text = mw.log.read_text()
    finally:
        if not pgs[1].running():
            pgs[1].start()
    commits, deadlocks, errors = result[0]
    assert errors == [], errors[:5]
    assert commits + deadlocks == 6 * 120
    rejoin_line = next(line for line in text.splitlines() if "REJOINED" in line)
    assert int(rejoin_line.split("REJOINED: ")[1].split(" units")[0]) >= 1, rejoin_line  # it had missed some
    sums = table_checksums(pgs, ("rmix", "rmix_log", "tierscope_recovery"))
    assert sums[0] == sums[1], sums
    s = stats["scheduler"]
    assert stats["disabled"] == [] and stats["backends"][1]["rejoined"] == 1, stats["backends"]
    assert s["row_units"] > 0 and s["granted_at_once"] > 0, s
    again: dict = {}
    with rust_middleware(servers, "lprf", stats=again, extra=ROWS + recovery):
        pass
    positions = set(again["recovery"]["positions_at_start"].values())
    assert len(positions) == 1 and again["recovery"]["replayed"] == {}, again["recovery"]
    print(f"commits {commits}, deadlocks {deadlocks}, {rejoin_line}, scheduler {s}")


def test_a_scope_worked_out_before_a_catalog_change_it_waited_for_takes_the_database(servers):
    """a holds row 1; b's ALTER TABLE (the whole database) waits for it; c's write of row 2, worked
    out from the facts before the ALTER, queues behind b. When a commits, b changes the catalog and
    c is granted: its scope came from facts that are stale now, so c takes the whole database too
    (counted in `stale_scopes`), and both servers end alike."""
    import psycopg

    _, pgs = servers
    keyed_table(pgs, "rstale")
    stats: dict = {}
    with (
        rust_middleware(servers, "lprf", stats=stats, extra=ROWS) as mw,
        psycopg.connect(dsn(mw)) as a,
        psycopg.connect(dsn(mw), autocommit=True) as b,
        psycopg.connect(dsn(mw)) as c,
    ):
        a.execute("UPDATE rstale SET v = 1 WHERE id = 1")
        alter, err_b = in_thread(lambda: b.execute("ALTER TABLE rstale ADD COLUMN w int NOT NULL DEFAULT 5"))
        assert not alter.wait(0.5)
        row2, err_c = in_thread(lambda: c.execute("UPDATE rstale SET v = 2 WHERE id = 2"))
        assert not row2.wait(0.5)
        a.commit()
        assert alter.wait(10) and row2.wait(10) and not err_b and not err_c, (err_b, err_c)
        c.commit()
    assert on_each(pgs, "SELECT id, v, w FROM rstale ORDER BY id") == [[(1, 1, 5), (2, 2, 5), (3, 0, 5)]] * 2
    s = stats["scheduler"]
    assert s["stale_scopes"] == 1 and s["database_units"] == 1 and stats["disabled"] == [], s
