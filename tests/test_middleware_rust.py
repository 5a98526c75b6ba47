"""The Rust middleware (`tierscope-engine middleware`, engine/src/middleware) on real PostgreSQL.

The same two servers as tests/test_middleware.py (its `pair` fixture and helpers), the Rust binary in
front of them. Ground truth for where reads went is
PostgreSQL's own statistics (`pg_stat_user_tables.seq_scan` of a probe table, `pg_stat_database`
transaction counts), compared with the policy's prediction from arithmetic and with the
middleware's counts (the --stats JSON written on SIGTERM); writes are checked by reading each
server directly. The binary is the one the lab runs (`tierscope.engine.engine_path()`:
$TIERSCOPE_ENGINE, else the venv's, else PATH), built by `make setup`; a missing one fails every
test here.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import test_middleware
from conftest import needs_postgres, needs_root
from test_middleware import DB, fresh_table, on_each, seq_scans
from tierscope.contracts.middleware import PASSWORD_ENV
from tierscope.engine import EngineNotFound, engine_path

#: the two PostgreSQL servers of tests/test_middleware.py (its module-scoped `pair` fixture, named
#: `servers` here; this module gets its own pair of servers)
servers = test_middleware.pair

pytestmark = [needs_root("PostgreSQL runs as its own OS user"), needs_postgres]


@pytest.fixture(scope="module", autouse=True)
def engine_built():
    """The engine binary with its `middleware` subcommand: missing or without it, every test here
    fails (never skips; `make setup` builds it)."""
    try:
        exe = engine_path()
    except EngineNotFound as err:
        pytest.fail(str(err))
    if not exe.exists():
        pytest.fail(f"{exe} ($TIERSCOPE_ENGINE) does not exist; run `make setup`")
    out = subprocess.run([str(exe), "middleware", "--help"], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.fail(f"{exe} has no `middleware` subcommand (rebuild: make setup): {out.stderr.strip()[:300]}")


def wait_for_log(mw, needle: str, timeout: float = 30.0) -> None:
    """Wait until the middleware's log holds `needle` (fails with the log after `timeout`)."""
    deadline = time.monotonic() + timeout
    while needle not in mw.log.read_text():
        assert time.monotonic() < deadline, f"no {needle!r} in the middleware's log: {mw.log.read_text()}"
        time.sleep(0.1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def rust_middleware(servers, policy="lprf", wait="first", stats=None, weights=None, pool=4, extra=()):
    """The Rust middleware in front of both servers; `stats` (a dict)
    receives the JSON it writes on SIGTERM."""
    work, pgs = servers
    port = free_port()
    stats_path = work / f"rust-mw-{port}.stats.json"
    log_path = work / f"rust-mw-{port}.log"
    creds = pgs[0].credentials  # the lab's user and password: the backends' and the clients'
    argv = [str(engine_path()), "middleware", "--listen", f"127.0.0.1:{port}", "--db", DB, "--user", creds.user]
    argv += ["--pool", str(pool), "--policy", policy, "--wait", wait, "--stats", str(stats_path), *extra]
    for p in pgs:
        argv += ["--backend", p.address]
    if weights is not None:
        argv += ["--weights", ",".join(f"{w:g}" for w in weights)]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=log, env={**os.environ, PASSWORD_ENV: creds.password})
    mw = SimpleNamespace(
        host="127.0.0.1",
        port=port,
        database=DB,
        proc=proc,
        log=log_path,
        stats_path=stats_path,
        user=creds.user,
        password=creds.password,
    )
    try:
        deadline = time.monotonic() + 20
        while "listening on" not in log_path.read_text():
            assert proc.poll() is None, f"the middleware exited: {log_path.read_text()}"
            assert time.monotonic() < deadline, f"the middleware did not start: {log_path.read_text()}"
            time.sleep(0.05)
        yield mw
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if stats is not None and stats_path.exists():
            stats.update(json.loads(stats_path.read_text()))


def dsn(mw, **kw) -> str:
    import psycopg

    params = {"host": mw.host, "port": mw.port, "user": mw.user, "password": mw.password, "dbname": mw.database}
    return psycopg.conninfo.make_conninfo(**{**params, **kw})


def db_counts(pgs, query, params, expected, timeout=10.0) -> list[int]:
    """One number per server from PostgreSQL's statistics, polled until `expected(counts)` holds
    (the servers flush a session's statistics within a second or at its end), up to `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        counts = [int(p.sql(query, DB, params)[0][0] or 0) for p in pgs]
        if expected(counts) or time.monotonic() > deadline:
            return counts
        time.sleep(0.1)


def xacts(pgs, column="xact_commit", expected=lambda c: True) -> list[int]:
    """Committed (or rolled back) transactions of the test database on each server."""
    return db_counts(pgs, f"SELECT {column} FROM pg_stat_database WHERE datname = %s", (DB,), expected)


def idx_scans(pgs, table, expected=lambda c: True) -> list[int]:
    """Index scans of `table` on each server."""
    q = "SELECT coalesce(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = %s"
    return db_counts(pgs, q, (table,), expected)


# --- reads ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "policy, weights, expected",
    [("lprf", None, [12, 0]), ("rr", None, [6, 6]), ("wrr", [3, 1], [9, 3])],
)
def test_reads_are_balanced_by_policy(servers, policy, weights, expected):
    """One client, one read at a time: LPRF always finds backend 1 idle; round robin alternates;
    smooth weighted round robin with 3:1 sends 9 of 12 to backend 1 (counted by the servers)."""
    import psycopg

    _, pgs = servers
    table = f"probe_rust_{policy}"
    fresh_table(pgs, table)
    before = seq_scans(pgs, table, 0)
    stats: dict = {}
    with (
        rust_middleware(servers, policy, stats=stats, weights=weights) as mw,
        psycopg.connect(dsn(mw), autocommit=True, prepare_threshold=None) as conn,
    ):
        for _ in range(12):
            assert conn.execute(f"SELECT count(*) FROM {table} /*request_id='r'*/").fetchone() == (3,)
    after = seq_scans(pgs, table, sum(before) + 12)
    assert [a - b for a, b in zip(after, before)] == expected
    assert [b["reads"] for b in stats["backends"]] == expected
    assert stats["policy"] == policy and stats["reads"] == 12 and stats["writes"] == 0
    assert_stats_keep_the_contract(stats)


def assert_stats_keep_the_contract(stats: dict) -> None:
    """The stats a real middleware wrote have the keys of its contract (contracts/middleware.json),
    no more, no fewer: what the runner and the studies read is there."""
    from tierscope.contracts.middleware import STATS_KEYS

    assert set(stats) == STATS_KEYS["top"], set(stats) ^ STATS_KEYS["top"]
    for b in stats["backends"]:
        assert set(b) == STATS_KEYS["backend"], set(b) ^ STATS_KEYS["backend"]
    assert set(stats["labels"]) == STATS_KEYS["labels"] and set(stats["series"]) == STATS_KEYS["series"]


def test_overlapping_reads_spread_over_both_backends_under_lprf(servers):
    """Two clients send a slow read at the same moment, round after round: the second read finds
    one pending on backend 1 and takes backend 2."""
    import psycopg

    _, pgs = servers
    fresh_table(pgs, "probe_rust_overlap")
    before = seq_scans(pgs, "probe_rust_overlap", 0)
    rounds, stats, errors = 4, {}, []
    barrier = threading.Barrier(2)
    with rust_middleware(servers, "lprf", stats=stats) as mw:

        def client():
            try:
                with psycopg.connect(dsn(mw), autocommit=True) as conn:
                    for _ in range(rounds):
                        barrier.wait(timeout=30)
                        conn.execute("SELECT pg_sleep(0.3), count(*) FROM probe_rust_overlap")
            except Exception as err:  # reported below
                errors.append(err)
                barrier.abort()

        threads = [threading.Thread(target=client) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    assert not errors
    after = seq_scans(pgs, "probe_rust_overlap", sum(before) + 2 * rounds)
    assert [a - b for a, b in zip(after, before)] == [rounds, rounds]
    assert [b["reads"] for b in stats["backends"]] == [rounds, rounds]


def test_least_response_time_avoids_a_slow_backend(servers):
    import psycopg

    _, pgs = servers
    for i, p in enumerate(pgs):
        p.sql("DROP VIEW IF EXISTS probe_rust_lrt", db=DB)
        p.sql(f"CREATE VIEW probe_rust_lrt AS SELECT {i} AS who, pg_sleep({0.02 if i == 0 else 0})::text AS s", db=DB)
    stats: dict = {}
    with rust_middleware(servers, "lrt", stats=stats) as mw, psycopg.connect(dsn(mw), autocommit=True) as conn:
        who = [conn.execute("SELECT who FROM probe_rust_lrt").fetchone()[0] for _ in range(40)]
    assert who[:2] == [0, 1] and who.count(1) >= 37, who
    lat = [b["read_latency_ms"] for b in stats["backends"]]
    assert lat[1] < 10 < lat[0]


@pytest.mark.parametrize(
    "policy, extra, light_scans, reads",
    [("aware", (), [20, 10], [23, 11]), ("lprf", ("--labels",), [30, 0], [33, 1])],
)
def test_aware_sends_light_reads_away_from_the_replica_running_a_heavy_one(servers, policy, extra, light_scans, reads):
    """Labels and the aware policy on real servers. The middleware learns the labels (20 light reads,
    2 heavy ones: `pg_sleep(0.5)`, all on the first replica, idle each time); then a heavy read runs
    on replica 1 (both idle: the first) and a read of a label not seen yet on replica 2 (one pending
    on replica 1), and 10 light reads follow one by one while both run (checked in
    pg_stat_activity before and after). LPRF sees one pending on each and gives every light read to
    replica 1, next to the heavy read; aware knows replica 2 runs a typical-sized read and replica 1
    a heavy one with at least a quarter of its average left, and gives them all to replica 2. The
    servers' scans of the light reads' table say where they ran; the middleware's stats say how it
    labelled them."""
    import psycopg

    _, pgs = servers
    table = "probe_rust_aware"
    fresh_table(pgs, table)
    before = seq_scans(pgs, table, 0)
    light = f"SELECT count(*) FROM {table} WHERE id = {{}}"
    heavy, other = "SELECT pg_sleep({}), 'heavy'", "SELECT pg_sleep(1.2) AS other"
    running = "SELECT query FROM pg_stat_activity WHERE state = 'active' AND query LIKE 'SELECT pg_sleep(%'"

    def on_server() -> list[list[str]]:
        return [[r[0] for r in p.sql(running, DB)] for p in pgs]

    stats: dict = {}
    errors: list[BaseException] = []
    with rust_middleware(servers, policy, stats=stats, extra=extra) as mw:
        conns = [psycopg.connect(dsn(mw), autocommit=True, prepare_threshold=None) for _ in range(3)]
        try:
            lc, hc, oc = conns
            for k in range(20):
                assert lc.execute(light.format(k % 3 + 1)).fetchone() == (1,)
            for _ in range(2):
                hc.execute(heavy.format(0.5))

            def run(conn, q):
                try:
                    conn.execute(q)
                except BaseException as err:  # reported below
                    errors.append(err)

            threads = [threading.Thread(target=run, args=(hc, heavy.format(1.5)))]
            threads[0].start()
            deadline = time.monotonic() + 10
            while on_server() != [[heavy.format(1.5)], []]:
                assert time.monotonic() < deadline, on_server()
                time.sleep(0.02)
            threads.append(threading.Thread(target=run, args=(oc, other)))
            threads[1].start()
            while on_server() != [[heavy.format(1.5)], [other]]:
                assert time.monotonic() < deadline, on_server()
                time.sleep(0.02)
            for k in range(10):
                assert lc.execute(light.format(k % 3 + 1)).fetchone() == (1,)
            assert on_server() == [[heavy.format(1.5)], [other]]  # the light reads ran while both did
            for t in threads:
                t.join(timeout=30)
        finally:
            for c in conns:
                c.close()
    assert not errors
    after = seq_scans(pgs, table, sum(before) + 30)
    assert [a - b for a, b in zip(after, before)] == light_scans
    lab = stats["labels"]
    # the labels (docs/middleware.md: literals replaced by ?; engine/tests/sql_cases.json)
    light_l, heavy_l = f"SELECT count(*) FROM {table} WHERE id = ?", "SELECT pg_sleep(?), ?"
    other_l = "SELECT pg_sleep(?) AS other"
    assert stats["policy"] == policy and lab["tracked"] is True
    assert lab["counts"] == {light_l: 30, heavy_l: 3, other_l: 1}  # 0.5 s and 1.5 s share a label
    assert lab["heavy"] == sorted([heavy_l, other_l])  # more than 10x the typical read's time
    assert lab["service_ms"][heavy_l] > 400 and lab["service_ms"][light_l] < 50
    assert lab["typical_ms"] == lab["service_ms"][light_l]  # the median over the executions
    assert [b["reads"] for b in stats["backends"]] == reads
    # heavy reads in flight: the second taught one and the one of the second part, on replica 1
    assert [b["heavy_reads"] for b in stats["backends"]] == [2, 0]
    series = stats["series"]["heavy"]
    assert max(series[pgs[0].address]) == 1 and max(series[pgs[1].address]) == 0


@pytest.mark.parametrize(
    "policy, extra, placed",
    [("aware", (), [0, 0, 1, 1]), ("lprf", ("--labels",), [0, 1, 0, 1])],
)
def test_aware_keeps_heavy_reads_together_while_they_would_wait_at_most_their_own_time(servers, policy, extra, placed):
    """The heavy-read rule on real servers. The middleware learns the labels (20 light reads, then
    one heavy read, `pg_sleep(2)` and a scan of the heavy table: its average A is 2 s or more, 10x
    the typical read's and more); then four heavy reads of that label start one after another, each
    from its own connection, each sent once the previous one runs (pg_stat_activity), none ending
    before all four run (3 s each). The rule: a heavy read goes to the replica already running the
    most heavy reads if it would wait there at most A (its own time), else to the least expected
    wait. H1: both idle, replica 1. H2: replica 1 expects max(A - e, A/4) <= A (e: the time H1 has
    run), H2 joins it. H3 (sent 0.2 s after H2 runs): replica 1 expects 2A - e1 - e2 > A as long as
    e1 + e2 < A, so it goes by the least expected wait to the idle replica 2; H4 would wait about
    2A - e1 - e2 on replica 1 (the most heavy reads, but more than A) and max(A - e3, A/4) <= A on
    replica 2: it joins H3. LPRF alternates by pending counts. The servers' pg_stat_activity says
    where each heavy read runs, their scans of the heavy table how many ran where; the middleware's
    stats and its 50 ms series say the same."""
    import psycopg

    _, pgs = servers
    table, light_table = "probe_rust_heavy", "probe_rust_heavy_light"
    fresh_table(pgs, table)
    fresh_table(pgs, light_table)
    before = seq_scans(pgs, table, 0)
    heavy = "SELECT pg_sleep({}), count(*) FROM " + table
    sleeps = (3.04, 3.03, 3.02, 3.01)  # distinct texts for pg_stat_activity, one label
    running = "SELECT query FROM pg_stat_activity WHERE state = 'active' AND query LIKE 'SELECT pg_sleep(%'"

    def on_server() -> list[set[str]]:
        return [{r[0] for r in p.sql(running, DB)} for p in pgs]

    stats: dict = {}
    errors: list[BaseException] = []
    with rust_middleware(servers, policy, stats=stats, extra=extra) as mw:
        conns = [psycopg.connect(dsn(mw), autocommit=True, prepare_threshold=None) for _ in range(5)]
        threads: list[threading.Thread] = []
        try:
            lc, hcs = conns[0], conns[1:]
            for k in range(20):
                assert lc.execute(f"SELECT count(*) FROM {light_table} WHERE id = {k % 3 + 1}").fetchone() == (1,)
            t0 = time.monotonic()
            hcs[0].execute(heavy.format(2))
            taught_s = time.monotonic() - t0

            def run(conn, q):
                try:
                    conn.execute(q)
                except BaseException as err:  # reported below
                    errors.append(err)

            sent, seen, where = [], [], []
            deadline = time.monotonic() + 15
            for k, s in enumerate(sleeps):
                if k == 2:
                    time.sleep(0.2)  # the series shows H1 and H2 together on replica 1 alone
                q = heavy.format(s)
                threads.append(threading.Thread(target=run, args=(hcs[k], q)))
                sent.append(time.monotonic())
                threads[-1].start()
                found = on_server()
                while not any(q in now for now in found):
                    assert time.monotonic() < deadline and not errors, (found, errors)
                    time.sleep(0.01)
                    found = on_server()
                seen.append(time.monotonic())
                where.append(next(i for i, now in enumerate(found) if q in now))
            assert on_server() == [{heavy.format(s) for s, w in zip(sleeps, where) if w == i} for i in (0, 1)]
            for t in threads:
                t.join(timeout=30)
        finally:
            for t in threads:
                t.join(timeout=30)
            for c in conns:
                c.close()
    assert not errors
    avg_s = stats["labels"]["service_ms"][stats["labels"]["heavy"][0]] / 1e3
    # the arithmetic holds when H1 and H2 together had run less than A when H4 was routed (an upper
    # bound from the client's clocks: from sending H1 and H2 to seeing H4 run)
    assert taught_s >= 2.0 and (seen[3] - sent[0]) + (seen[3] - sent[1]) < 2.0, (taught_s, sent, seen)
    assert where == placed, where
    after = seq_scans(pgs, table, sum(before) + 5)
    assert [a - b for a, b in zip(after, before)] == [1 + placed.count(0), placed.count(1)]
    lab = stats["labels"]
    assert stats["policy"] == policy and len(lab["heavy"]) == 1 and lab["counts"][lab["heavy"][0]] == 5
    assert avg_s >= 2.0  # the taught 2 s moved towards the four 3 s reads (moving average)
    assert [b["heavy_reads"] for b in stats["backends"]] == [placed.count(0), placed.count(1)]
    assert [b["reads"] for b in stats["backends"]] == [21 + placed.count(0), placed.count(1)]
    series = stats["series"]
    assert series["interval_s"] == 0.05
    hs = list(zip(*(series["heavy"][p.address] for p in pgs)))
    assert max(h[0] for h in hs) == placed.count(0) and max(h[1] for h in hs) == placed.count(1)
    # H1 and H2 together on replica 1 with none on replica 2 for 0.2 s under aware, never under LPRF
    assert ((2, 0) in hs) == (policy == "aware"), hs
    assert all(len(v) == len(series["t_s"]) for part in ("pending", "heavy", "reads") for v in series[part].values())


# --- writes --------------------------------------------------------------------------------------


@pytest.mark.parametrize("wait", ["first", "all"])
def test_writes_reach_both_backends_with_one_now(servers, wait):
    import psycopg

    _, pgs = servers
    table = f"rw_{wait}"
    stats: dict = {}
    with rust_middleware(servers, wait=wait, stats=stats) as mw:
        with psycopg.connect(dsn(mw), autocommit=True, prepare_threshold=None) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
            conn.execute(f"CREATE TABLE {table} (id serial PRIMARY KEY, v text, at timestamptz)")
            ids = [
                conn.execute(
                    f"INSERT INTO {table} (v, at) VALUES (%s, NOW()) RETURNING id /*request_id='x'*/", (f"v{i}",)
                ).fetchone()[0]
                for i in range(10)
            ]
            conn.execute(f"UPDATE {table} SET v = v || '!' WHERE id <= %s", (4,))
        with psycopg.connect(dsn(mw), autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
            for i in range(5):  # the simple-query protocol
                conn.execute(f"INSERT INTO {table} (v, at) VALUES (%s, current_timestamp)", (f"q{i}",))
    assert ids == list(range(1, 11))
    rows = on_each(pgs, f"SELECT id, v, at FROM {table} ORDER BY id")
    assert len(rows[0]) == 15 and rows[0] == rows[1]  # the same timestamps: NOW() became one literal
    assert len({r[2] for r in rows[0]}) == 15
    assert sum(1 for r in rows[0] if r[1].endswith("!")) == 4
    assert stats["wait"] == wait and stats["disabled"] == []
    assert stats["writes"] == 18 and stats["macros_rewritten"] == 15
    assert [b["writes"] for b in stats["backends"]] == [18, 18]


def test_a_transaction_with_a_write_runs_on_both_and_rolls_back_on_both(servers):
    """Inside BEGIN ... COMMIT every statement (reads too) runs on both servers, under the write
    lock: each server has the committed rows and rolled back the failed transaction (pg_stat_database)."""
    import psycopg

    _, pgs = servers
    for p in pgs:
        p.sql("DROP TABLE IF EXISTS rtx", DB)
        p.sql("CREATE TABLE rtx (id int PRIMARY KEY, n int)", DB)
    stats: dict = {}
    commits0, rollbacks0 = xacts(pgs), xacts(pgs, "xact_rollback")
    with rust_middleware(servers, "rr", stats=stats) as mw, psycopg.connect(dsn(mw)) as conn:
        for i in range(5):
            with conn.transaction():
                conn.execute("INSERT INTO rtx VALUES (%s, %s)", (i, i))
                assert conn.execute("SELECT count(*) FROM rtx").fetchone() == (i + 1,)
                conn.execute("UPDATE rtx SET n = n + 1 WHERE id = %s", (i,))
        with pytest.raises(psycopg.errors.UniqueViolation), conn.transaction():
            conn.execute("INSERT INTO rtx VALUES (100, 1)")
            conn.execute("INSERT INTO rtx VALUES (0, 1)")  # a duplicate on both: both roll back
    assert on_each(pgs, "SELECT id, n FROM rtx ORDER BY id") == [[(i, i + 1) for i in range(5)]] * 2
    # each server rolled back the failed transaction exactly once (and committed the 5 others, among
    # the statistics queries' own commits): the transactions ran on both, not on one by policy
    rollbacks = xacts(pgs, "xact_rollback", lambda c: all(a - b >= 1 for a, b in zip(c, rollbacks0)))
    commits = xacts(pgs, "xact_commit", lambda c: all(a - b >= 5 for a, b in zip(c, commits0)))
    assert [a - b for a, b in zip(rollbacks, rollbacks0)] == [1, 1]
    assert all(a - b >= 5 for a, b in zip(commits, commits0)), (commits0, commits)
    # BEGIN is answered by the middleware and goes to the servers with the first statement, so the
    # write units are the transactions' statements: INSERT, SELECT, UPDATE, COMMIT (4 x 5); INSERT,
    # INSERT, ROLLBACK (3)
    assert stats["writes"] == 5 * 4 + 3 and stats["transaction_units"] == 5 * 4 + 3 and stats["disabled"] == []
    assert stats["reads"] == 0  # every unit of these transactions was broadcast


def test_a_begin_takes_the_write_lock_only_with_its_first_statement(servers):
    """A plain BEGIN is answered by the middleware and sent with the transaction's first statement:
    a transaction opened and idle holds no write lock, so another session's write goes through at
    once (C-JDBC takes the lock at the first write too); once the transaction has written, the other
    session's write waits for its COMMIT. Both servers end with the same rows, in the same order."""
    import psycopg

    _, pgs = servers
    for p in pgs:
        p.sql("DROP TABLE IF EXISTS rbeg", DB)
        p.sql("CREATE TABLE rbeg (seq serial PRIMARY KEY, who text)", DB)
    stats: dict = {}
    with (
        rust_middleware(servers, "rr", stats=stats) as mw,
        psycopg.connect(dsn(mw), autocommit=True) as a,
        psycopg.connect(dsn(mw), autocommit=True) as b,
    ):

        def insert_by_b(who: str) -> threading.Event:
            done = threading.Event()
            threading.Thread(target=lambda: (b.execute(f"INSERT INTO rbeg (who) VALUES ('{who}')"), done.set())).start()
            return done

        a.execute("BEGIN")  # autocommit: psycopg sends no BEGIN of its own, this is the one
        assert a.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        try:
            # not behind a's open, idle transaction (it would wait for a's COMMIT if BEGIN took the lock)
            assert insert_by_b("b1").wait(5.0), "b's write waited for a transaction that had only begun"
            a.execute("INSERT INTO rbeg (who) VALUES ('a')")  # a's BEGIN and INSERT: a holds the lock now
            b2 = insert_by_b("b2")
            assert not b2.wait(1.0), "b's write went through while a's transaction held the write lock"
        finally:
            a.execute("COMMIT")
        assert b2.wait(10.0)
    assert on_each(pgs, "SELECT seq, who FROM rbeg ORDER BY seq") == [[(1, "b1"), (2, "a"), (3, "b2")]] * 2
    assert stats["disabled"] == [] and stats["writes"] == 4  # b1, a's INSERT (with BEGIN), COMMIT, b2


def test_transactions_psycopg_begins_itself_in_every_mode(servers):
    """psycopg outside autocommit sends its own BEGIN before the first statement: as a simple Query,
    and in pipeline mode flushed before Sync (where the middleware sends the BEGIN it answered
    first, then runs the flushed unit like a write). Prepared or not, pipelined or not, each
    transaction commits or rolls back whole on both servers."""
    import psycopg

    _, pgs = servers
    for p in pgs:
        p.sql("DROP TABLE IF EXISTS rmodes", DB)
        p.sql("CREATE TABLE rmodes (id int PRIMARY KEY, how text)", DB)
    modes = [(None, False), (0, False), (None, True), (0, True)]  # (prepare_threshold, pipeline)
    stats: dict = {}
    with rust_middleware(servers, "rr", stats=stats) as mw:
        for i, (threshold, pipeline) in enumerate(modes):
            with psycopg.connect(dsn(mw), prepare_threshold=threshold) as conn:
                block = conn.pipeline if pipeline else contextlib.nullcontext
                with block():
                    conn.execute("INSERT INTO rmodes VALUES (%s, %s)", (2 * i, f"{threshold}/{pipeline}"))
                    conn.execute("INSERT INTO rmodes VALUES (%s, %s)", (2 * i + 1, "rolled back"))
                conn.rollback()  # both rows gone
                with block():
                    conn.execute("INSERT INTO rmodes VALUES (%s, %s)", (2 * i, f"{threshold}/{pipeline}"))
                    assert conn.execute("SELECT count(*) FROM rmodes WHERE id = %s", (2 * i,)).fetchone() == (1,)
                conn.commit()
    expected = [(2 * i, f"{t}/{p}") for i, (t, p) in enumerate(modes)]
    assert on_each(pgs, "SELECT id, how FROM rmodes ORDER BY id") == [expected] * 2
    assert stats["disabled"] == [] and stats["flushed_units"] > 0  # the pipelines flushed before Sync


def test_psycopg_prepared_statements_and_the_extended_protocol(servers):
    """prepare_threshold=0: psycopg prepares every statement (Parse with a name), the middleware
    keeps them and runs them on either backend as the unnamed statement."""
    import psycopg

    _, pgs = servers
    for p in pgs:
        p.sql("DROP TABLE IF EXISTS rps", DB)
    fresh_table(pgs, "probe_rust_ps")
    before = seq_scans(pgs, "probe_rust_ps", 0)
    stats: dict = {}
    with (
        rust_middleware(servers, "rr", stats=stats) as mw,
        psycopg.connect(dsn(mw), autocommit=True, prepare_threshold=0) as conn,
    ):
        conn.execute("CREATE TABLE rps (id int PRIMARY KEY, n int)")
        for i in range(6):
            conn.execute("INSERT INTO rps VALUES (%s, %s)", (i, i * i))
            assert conn.execute("SELECT n FROM rps WHERE id = %s", (i,)).fetchone() == (i * i,)
            conn.execute("UPDATE rps SET n = n + 1 WHERE id = %s", (i,))
        for _ in range(10):
            assert conn.execute("SELECT count(*) FROM probe_rust_ps WHERE id > %s", (0,)).fetchone() == (3,)
        cur = conn.execute("SELECT id, n FROM rps WHERE id < %s ORDER BY id", (3,))
        assert [d.name for d in cur.description] == ["id", "n"] and cur.fetchall() == [(0, 1), (1, 2), (2, 5)]
        # the middleware keeps executed statements prepared on its backend connections; DDL through
        # it makes them prepared again (a kept plan would fail: "cached plan must not change result type")
        conn.execute("ALTER TABLE rps ALTER COLUMN n TYPE bigint")
        for i in range(4):
            assert conn.execute("SELECT n FROM rps WHERE id = %s", (i,)).fetchone() == (i * i + 1,)
        conn.execute("DEALLOCATE ALL")
        assert conn.execute("SELECT sum(n) FROM rps").fetchone() == (sum(i * i + 1 for i in range(6)),)
        with pytest.raises(psycopg.errors.UndefinedTable):
            conn.execute("SELECT * FROM no_such_table WHERE id = %s", (1,))
        assert conn.execute("SELECT 7").fetchone() == (7,)  # the session goes on
    after = seq_scans(pgs, "probe_rust_ps", sum(before) + 10)
    assert [a - b for a, b in zip(after, before)] == [5, 5]  # round robin over both, prepared or not
    assert stats["named_statements"] > 0 and stats["disabled"] == []
    assert on_each(pgs, "SELECT count(*), sum(n) FROM rps") == [[(6, sum(i * i + 1 for i in range(6)))]] * 2


def test_pipeline_mode_copy_and_unknown_database(servers):
    import psycopg

    _, pgs = servers
    stats: dict = {}
    with rust_middleware(servers, stats=stats) as mw:
        with psycopg.connect(dsn(mw), autocommit=True) as conn:
            conn.execute("DROP TABLE IF EXISTS rpl")
            conn.execute("CREATE TABLE rpl (id int)")
            with conn.pipeline():
                for i in range(5):
                    conn.execute("INSERT INTO rpl VALUES (%s)", (i,))
                assert conn.execute("SELECT count(*) FROM rpl").fetchone() == (5,)
            with (
                pytest.raises(psycopg.errors.FeatureNotSupported, match="COPY is not supported"),
                conn.cursor().copy("COPY rpl FROM STDIN") as cp,
            ):
                cp.write_row((1,))
            assert conn.execute("SELECT 1").fetchone() == (1,)
        with pytest.raises(psycopg.OperationalError, match='database "other" does not exist'):
            psycopg.connect(dsn(mw, dbname="other"))
    assert on_each(pgs, "SELECT count(*) FROM rpl") == [[(5,)], [(5,)]]
    assert stats["disabled"] == [] and stats["errors_to_clients"] >= 1


def test_a_backend_that_fails_a_write_the_other_executed_is_disabled(servers):
    import psycopg

    _, pgs = servers
    fresh_table(pgs, "probe_rust_dis")
    for p in pgs:
        p.sql("DROP TABLE IF EXISTS ru", DB)
        p.sql("CREATE TABLE ru (id int PRIMARY KEY)", DB)
    pgs[1].sql("INSERT INTO ru VALUES (1)", DB)  # backend 2 is out of sync
    before = seq_scans(pgs, "probe_rust_dis", 0)
    stats: dict = {}
    with rust_middleware(servers, "rr", stats=stats) as mw, psycopg.connect(dsn(mw), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.UndefinedTable):  # every backend fails it: nobody disabled
            conn.execute("INSERT INTO no_such_table VALUES (1)")
        conn.execute("SELECT count(*) FROM probe_rust_dis")
        conn.execute("SELECT count(*) FROM probe_rust_dis")
        conn.execute("INSERT INTO ru VALUES (1)")  # backend 1 executes it, backend 2 fails: disabled
        for _ in range(5):
            conn.execute("SELECT count(*) FROM probe_rust_dis")
        conn.execute("INSERT INTO ru VALUES (2)")
    after = seq_scans(pgs, "probe_rust_dis", sum(before) + 7)
    assert [a - b for a, b in zip(after, before)] == [6, 1]
    assert on_each(pgs, "SELECT id FROM ru ORDER BY id") == [[(1,), (2,)], [(1,)]]
    assert stats["disabled"] == [pgs[1].address]
    b1, b2 = stats["backends"]
    assert b2["failed_writes"] == 1 and "duplicate key" in b2["disabled_reason"]
    assert b1["enabled"] and b1["failed_writes"] == 0
    assert "DISABLED" in mw.log.read_text()


@pytest.mark.parametrize("scheduler", ["lock", "rows"])
def test_a_backend_killed_mid_run_is_disabled_and_queries_go_on(servers, scheduler):
    """Four clients read and write while backend 2 is stopped: every query is answered, backend 2
    is disabled and counted, and backend 1 has every write. Under either scheduler (with the row
    scheduler the INSERTs into a table without a key run side by side)."""
    import psycopg

    _, pgs = servers
    fresh_table(pgs, "probe_rust_gone")
    for p in pgs:
        p.sql("DROP TABLE IF EXISTS rgone", DB)
        p.sql("CREATE TABLE rgone (id int)", DB)
    stats: dict = {}
    errors: list = []
    done = [0] * 4
    inserted = [0] * 4
    stop = threading.Event()
    try:
        with rust_middleware(servers, "rr", stats=stats, extra=("--scheduler", scheduler)) as mw:

            def client(k):
                try:
                    with psycopg.connect(dsn(mw), autocommit=True) as conn:
                        i = 0
                        while not stop.is_set():
                            assert conn.execute("SELECT count(*) FROM probe_rust_gone").fetchone() == (3,)
                            if i % 5 == 0:
                                conn.execute("INSERT INTO rgone VALUES (%s)", (k,))
                                inserted[k] += 1
                            i += 1
                            done[k] += 1
                except Exception as err:  # reported below
                    errors.append(err)

            threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
            for t in threads:
                t.start()
            time.sleep(1.0)
            halfway = sum(done)
            pgs[1].stop()
            time.sleep(1.5)
            stop.set()
            for t in threads:
                t.join(timeout=30)
            assert sum(done) > halfway + 20  # queries went on after the stop
    finally:
        pgs[1].start()
    assert not errors, errors
    assert stats["disabled"] == [pgs[1].address]
    assert re.search("read failed|write failed", stats["backends"][1]["disabled_reason"])
    assert stats["backends"][0]["enabled"]
    assert on_each(pgs, "SELECT count(*) FROM rgone")[0] == [(sum(inserted),)]
    assert stats["reads"] >= sum(done)
    assert stats["scheduler"]["name"] == scheduler
    if scheduler == "rows":
        assert stats["scheduler"]["shared_units"] == sum(inserted) and stats["scheduler"]["database_units"] == 0


# --- pgbench through it --------------------------------------------------------------------------


def pgbench_exe() -> Path:
    """PostgreSQL's pgbench (beside the servers' binaries, else on PATH)."""
    from tierscope.services.postgres import pg_bindir

    exe = pg_bindir() / "pgbench"
    return exe if exe.exists() else Path(shutil.which("pgbench") or "/nonexistent")


def pgbench_init(pgs, pgbench: Path) -> None:
    """pgbench's tables at scale 1 on each server, directly (the same rows on both)."""
    for p in pgs:
        subprocess.run(
            [
                str(pgbench),
                "-i",
                "-q",
                "-s",
                "1",
                "-h",
                p.host.address,
                "-p",
                str(p.port),
                "-U",
                p.credentials.user,
                DB,
            ],
            check=True,
            capture_output=True,
            env={**os.environ, **p.credentials.env()},
        )


def test_pgbench_select_only_and_tpcb_through_the_rust_middleware(servers):
    """pgbench -S (simple, extended and prepared) and the TPC-B-like script: pgbench's transaction
    counts match the middleware's and the servers', and both replicas end with the same balances."""
    work, pgs = servers
    pgbench = pgbench_exe()
    pgbench_init(pgs, pgbench)
    stats: dict = {}

    def run(mw, *args) -> int:
        out = subprocess.run(
            [
                str(pgbench),
                "-h",
                mw.host,
                "-p",
                str(mw.port),
                "-U",
                mw.user,
                "-n",
                "-c",
                "2",
                "-t",
                "100",
                *args,
                DB,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PGPASSWORD": mw.password},
        )
        assert out.returncode == 0, out.stdout + out.stderr
        return int(re.search(r"number of transactions actually processed: (\d+)", out.stdout).group(1))

    with rust_middleware(servers, "lprf", stats=stats) as mw:
        scans0 = idx_scans(pgs, "pgbench_accounts")
        selects = sum(run(mw, "-S", "-M", mode) for mode in ("simple", "extended", "prepared"))
        # every -S transaction is one index scan of pgbench_accounts on one server (and nothing else is)
        scans1 = idx_scans(pgs, "pgbench_accounts", lambda c: sum(c) - sum(scans0) >= 600)
        tpcb = run(mw, "-M", "extended")
        # TPC-B's UPDATE and SELECT of pgbench_accounts run on both servers: 2 scans per transaction each
        scans2 = idx_scans(pgs, "pgbench_accounts", lambda c: all(a - b >= 400 for a, b in zip(c, scans1)))
    assert selects == 600 and tpcb == 200
    assert sum(scans1) - sum(scans0) == 600 and [a - b for a, b in zip(scans2, scans1)] == [400, 400]
    # pgbench's own catalog queries at start are reads too
    assert stats["reads"] >= 600 and stats["disabled"] == []
    # TPC-B: BEGIN; UPDATE; SELECT; UPDATE; UPDATE; INSERT; END: BEGIN answered by the middleware,
    # sent with the UPDATE: 6 write units, each inside the transaction
    assert stats["writes"] == 6 * 200 and stats["transaction_units"] == 6 * 200
    hist = on_each(pgs, "SELECT count(*), sum(delta) FROM pgbench_history")
    assert hist[0] == hist[1] and hist[0][0][0] == 200
    balances = on_each(pgs, "SELECT sum(abalance), sum(bbalance) FROM pgbench_accounts, pgbench_branches")
    assert balances[0] == balances[1]


# --- the process ---------------------------------------------------------------------------------


def test_stats_are_written_on_sigterm_and_bad_flags_are_refused(servers):
    import psycopg

    _, pgs = servers
    stats: dict = {}
    with rust_middleware(servers, "lprf", stats=stats, extra=("--series-interval", "0.05")) as mw:
        with psycopg.connect(dsn(mw), autocommit=True) as conn:
            for _ in range(3):
                conn.execute("SELECT 1")
        time.sleep(0.3)
        mw.proc.send_signal(signal.SIGTERM)
        assert mw.proc.wait(timeout=15) == 0
    assert stats["sessions"] == 1 and stats["reads"] == 3 and stats["units"] == 3
    assert {"policy", "wait", "uptime_s", "disabled", "backends", "labels", "series"} <= set(stats)
    assert [b["name"] for b in stats["backends"]] == [p.address for p in pgs]
    series = stats["series"]
    assert series["interval_s"] == 0.05 and len(series["t_s"]) >= 4
    assert series["reads"][pgs[0].address][-1] == 3
    assert "stopped: 3 units, 3 reads" in mw.log.read_text()
    assert stats["protocol"] == "postgres" and stats["labels"]["tracked"] is False and not stats["labels"]["counts"]
    for bad, says in (
        (("--policy", "fastest"), "expected one of lprf, rr, wrr, lrt, aware"),
        (("--policy", "aware", "--heavy-factor", "1"), "--heavy-factor 1: expected > 1"),
    ):
        out = subprocess.run(
            [str(engine_path()), "middleware", "--listen", "127.0.0.1:1", "--backend", pgs[0].address, *bad],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 2 and says in out.stderr, out.stderr
