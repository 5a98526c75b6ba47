"""The clustering middleware (C-JDBC-like RAIDb-1, `tierscope-engine middleware`) on real PostgreSQL.

Pure rules (classification, the policies' choices, macro rewriting, the reply bookkeeping, the
framing): `cargo test` in engine/src/middleware (named below).

Real parts: two PostgreSQL servers on loopback behind the middleware. The ground truth for where
reads went is PostgreSQL's own statistics (`pg_stat_user_tables.seq_scan` of a probe table on
each server), compared with the LPRF/RR prediction from arithmetic and with the middleware's
counts; writes are checked by reading each server directly.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import tomllib
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# --- pure rules: `cargo test` (engine/src/middleware), the cases the Python middleware had here ----
#
# classification and labels: engine/tests/sql_cases.json (sql.rs: classification_matches_the_shared_cases,
#   labels_match_the_shared_cases; and pytest through the running middleware,
#   tests/test_middleware_sql_cases.py)
# LPRF: balance.rs lprf_takes_the_first_least_pending, lprf_sequence_of_reads_that_do_not_finish
# round robin: balance.rs round_robin_skips_disabled_backends
# smooth weighted round robin: balance.rs smooth_weighted_round_robin_interleaves_by_weight
# least response time, the moving average: balance.rs least_response_time_times_in_flight
# macro rewriting (this file's former cases included): sql.rs macros_are_rewritten_like_the_python_middleware
# the reply plan: replies.rs hides_the_proxys_messages_and_adds_its_own_answers,
#   after_an_error_expects_only_ready
# framing: wire.rs framing_round_trip


def test_help_names_every_option_and_bad_flags_are_refused():
    from tierscope.services.middleware import engine_middleware

    out = subprocess.run([*engine_middleware(), "--help"], capture_output=True, text=True, check=True).stdout
    for opt in ("--listen", "--backend", "--db", "--user", "--pool", "--policy", "--wait", "--stats", "--protocol"):
        assert opt in out
    bad = subprocess.run(
        [*engine_middleware(), "--listen", "nowhere", "--backend", "x:1"],
        capture_output=True,
        text=True,
        env={**os.environ, "TIERSCOPE_MIDDLEWARE_PASSWORD": "x"},
    )
    assert bad.returncode == 2 and '--listen "nowhere": expected ADDR:PORT' in bad.stderr, bad.stderr


def test_runner_refuses_what_it_cannot_run_with_a_clear_reason():
    from tierscope.runner import PointFailed, check_db_topology

    with pytest.raises(PointFailed, match="a Galera cluster replicates by itself"):
        check_db_topology("galera", 2, 1)
    check_db_topology("mariadb", 2, 1)  # the middleware speaks the MySQL protocol too
    with pytest.raises(PointFailed, match="2 database servers and no clustering middleware"):
        check_db_topology("postgres", 2, 0)
    check_db_topology("postgres", 2, 1)
    check_db_topology("postgres", 1, 2)
    check_db_topology("mariadb", 1, 0)


# --- real: two PostgreSQL servers behind the middleware -----------------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="PostgreSQL runs as its own OS user: needs root")
DB = "mwtest"


@pytest.fixture(scope="module")
def pair():
    """Two PostgreSQL servers on loopback, each with an empty database `mwtest`."""
    if os.geteuid() != 0:
        pytest.skip("PostgreSQL runs as its own OS user: needs root")
    from tierscope.services.base import free_port
    from tierscope.services.postgres import Postgres
    from tierscope.testbed.host import Host

    # not under pytest's 0700 tmp dirs: the postgres user must reach its data directory
    work = Path(tempfile.mkdtemp(prefix="tierscope-mw-test-"))
    pgs = [
        Postgres(
            Host.loopback(f"db{i}"),
            free_port(),
            work / f"db{i}",
            fsync=False,
            shared_buffers="32MB",
            max_connections=60,
            name=f"db{i}",
        )
        for i in (1, 2)
    ]
    try:
        for p in pgs:
            p.start()
            p.create_database(DB)
        yield work, pgs
    finally:
        for p in pgs:
            p.stop()
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def middleware(pair, policy="lprf", wait="first", db=DB, name="mw", stats=None, weights=None):
    """The middleware in front of both servers; `stats` (a dict) receives its counts after it stops."""
    from tierscope.services.base import free_port
    from tierscope.services.middleware import Middleware
    from tierscope.testbed.host import Host

    work, pgs = pair
    mw = Middleware(
        Host.loopback(name),
        free_port(),
        work / name,
        backends=[p.address for p in pgs],
        database=db,
        pool=4,
        policy=policy,
        wait=wait,
        weights=weights,
        name=name,
    )
    mw.start()
    try:
        yield mw
    finally:
        mw.stop()
        if stats is not None and mw.stats_path.exists():
            stats.update(mw.stats())


def dsn(mw, **kw) -> str:
    return mw.dsn()


def on_each(pgs, statement, params=None):
    return [p.sql(statement, DB, params) for p in pgs]


def fresh_table(pgs, name, rows=3):
    """A probe table with the same rows on both servers, created directly (not through the proxy)."""
    for p in pgs:
        p.sql(f"DROP TABLE IF EXISTS {name}", DB)
        p.sql(f"CREATE TABLE {name} (id int)", DB)
        p.sql(f"INSERT INTO {name} SELECT generate_series(1, {rows})", DB)


def seq_scans(pgs, table, expected_total, timeout=10.0) -> list[int]:
    """Sequential scans of `table` on each server, by PostgreSQL's statistics; waits until the
    servers have flushed the scans of the middleware's (closed) sessions, up to `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        counts = [
            int(p.sql("SELECT coalesce(seq_scan, 0) FROM pg_stat_user_tables WHERE relname = %s", DB, (table,))[0][0])
            for p in pgs
        ]
        if sum(counts) >= expected_total or time.monotonic() > deadline:
            return counts
        time.sleep(0.1)


def test_sequential_reads_all_go_to_the_first_backend_under_lprf(pair):
    import psycopg

    _, pgs = pair
    fresh_table(pgs, "probe_seq")
    before = seq_scans(pgs, "probe_seq", 0)
    stats: dict = {}
    with (
        middleware(pair, "lprf", stats=stats) as mw,
        psycopg.connect(dsn(mw), autocommit=True, prepare_threshold=None) as conn,
    ):
        for _ in range(12):
            assert conn.execute("SELECT count(*) FROM probe_seq /*request_id='r'*/").fetchone() == (3,)
    after = seq_scans(pgs, "probe_seq", sum(before) + 12)
    # one client, one read at a time: every read finds 0 pending on the first backend
    assert [a - b for a, b in zip(after, before)] == [12, 0]
    assert [b["reads"] for b in stats["backends"]] == [12, 0]


def test_round_robin_alternates_reads(pair):
    import psycopg

    _, pgs = pair
    fresh_table(pgs, "probe_rr")
    before = seq_scans(pgs, "probe_rr", 0)
    stats: dict = {}
    with middleware(pair, "rr", stats=stats) as mw, psycopg.connect(dsn(mw), autocommit=True) as conn:
        for _ in range(11):
            conn.execute("SELECT count(*) FROM probe_rr")
    after = seq_scans(pgs, "probe_rr", sum(before) + 11)
    assert [a - b for a, b in zip(after, before)] == [6, 5]
    assert [b["reads"] for b in stats["backends"]] == [6, 5]


def test_weighted_round_robin_reads_by_weight(pair):
    import psycopg

    _, pgs = pair
    fresh_table(pgs, "probe_wrr")
    before = seq_scans(pgs, "probe_wrr", 0)
    stats: dict = {}
    with middleware(pair, "wrr", stats=stats, weights=[3, 1]) as mw, psycopg.connect(dsn(mw), autocommit=True) as conn:
        for _ in range(12):
            conn.execute("SELECT count(*) FROM probe_wrr")
    after = seq_scans(pgs, "probe_wrr", sum(before) + 12)
    assert [a - b for a, b in zip(after, before)] == [9, 3]
    assert [b["reads"] for b in stats["backends"]] == [9, 3] and stats["policy"] == "wrr"
    assert [b["weight"] for b in stats["backends"]] == [3, 1]


def test_least_response_time_sends_reads_away_from_a_slow_backend(pair):
    """Backend 1 answers a read in ~20 ms (pg_sleep in a view), backend 2 at once: after each has
    been tried, lrt sends the reads to backend 2 although one client never queues on either."""
    import psycopg

    _, pgs = pair
    for i, p in enumerate(pgs):
        p.sql("DROP VIEW IF EXISTS probe_lrt", db=DB)
        p.sql(f"CREATE VIEW probe_lrt AS SELECT {i} AS who, pg_sleep({0.02 if i == 0 else 0})::text AS slept", db=DB)
    stats: dict = {}
    with middleware(pair, "lrt", stats=stats) as mw, psycopg.connect(dsn(mw), autocommit=True) as conn:
        who = [conn.execute("SELECT who FROM probe_lrt").fetchone()[0] for _ in range(40)]
    assert who[:2] == [0, 1] and who.count(1) >= 37, who  # each tried once, then the slow one avoided
    lat = {b["name"]: b["read_latency_ms"] for b in stats["backends"]}
    assert min(lat.values()) < 10 < max(lat.values())


def test_overlapping_reads_spread_over_both_backends_under_lprf(pair):
    """Two clients send a slow read at the same moment, round after round: the first read finds
    [0,0] pending and takes backend 1, the second finds [1,0] and takes backend 2."""
    import psycopg

    _, pgs = pair
    fresh_table(pgs, "probe_lprf")
    before = seq_scans(pgs, "probe_lprf", 0)
    rounds, stats = 4, {}
    barrier = threading.Barrier(2)
    errors: list = []
    with middleware(pair, "lprf", stats=stats) as mw:

        def client():
            try:
                with psycopg.connect(dsn(mw), autocommit=True) as conn:
                    for _ in range(rounds):
                        barrier.wait(timeout=30)
                        conn.execute("SELECT pg_sleep(0.3), count(*) FROM probe_lprf")
            except Exception as err:  # reported below
                errors.append(err)
                barrier.abort()

        threads = [threading.Thread(target=client) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    assert not errors
    after = seq_scans(pgs, "probe_lprf", sum(before) + 2 * rounds)
    assert [a - b for a, b in zip(after, before)] == [rounds, rounds]
    assert [b["reads"] for b in stats["backends"]] == [rounds, rounds]


@pytest.mark.parametrize("wait", ["first", "all"])
def test_writes_land_on_both_backends_with_one_now(pair, wait):
    import psycopg

    _, pgs = pair
    stats: dict = {}
    with middleware(pair, wait=wait, stats=stats) as mw:
        with psycopg.connect(dsn(mw), autocommit=True, prepare_threshold=None) as conn:
            conn.execute("DROP TABLE IF EXISTS w")
            conn.execute("CREATE TABLE w (id serial PRIMARY KEY, v text, at timestamptz)")
            ids = [
                conn.execute(
                    "INSERT INTO w (v, at) VALUES (%s, NOW()) RETURNING id /*request_id='x'*/", (f"v{i}",)
                ).fetchone()[0]
                for i in range(10)
            ]
            conn.execute("UPDATE w SET v = v || '!' WHERE id <= %s", (4,))
        # the simple-query protocol too (psycopg's client-side binding)
        with psycopg.connect(dsn(mw), autocommit=True, cursor_factory=psycopg.ClientCursor) as conn:
            for i in range(5):
                conn.execute("INSERT INTO w (v, at) VALUES (%s, current_timestamp)", (f"q{i}",))
    assert ids == list(range(1, 11))
    rows = on_each(pgs, "SELECT id, v, at FROM w ORDER BY id")
    assert len(rows[0]) == 15
    assert rows[0] == rows[1]  # same ids, values and timestamps: NOW() became one literal per write
    assert len({r[2] for r in rows[0]}) == 15  # and a new literal for every write
    assert sum(1 for r in rows[0] if r[1].endswith("!")) == 4
    assert stats["wait"] == wait
    assert stats["writes"] >= 18 and stats["macros_rewritten"] == 15 and stats["disabled"] == []
    assert [b["writes"] for b in stats["backends"]] == [stats["writes"]] * 2


def test_a_backend_that_fails_a_write_the_other_executed_is_disabled(pair):
    import psycopg

    _, pgs = pair
    fresh_table(pgs, "probe_dis")
    for p in pgs:
        p.sql("DROP TABLE IF EXISTS u", DB)
        p.sql("CREATE TABLE u (id int PRIMARY KEY)", DB)
    pgs[1].sql("INSERT INTO u VALUES (1)", DB)  # backend 2 is now out of sync
    before = seq_scans(pgs, "probe_dis", 0)
    stats: dict = {}
    with middleware(pair, "rr", stats=stats) as mw, psycopg.connect(dsn(mw), autocommit=True) as conn:
        # a write every backend fails: the client gets the error, nobody is disabled
        with pytest.raises(psycopg.errors.UndefinedTable):
            conn.execute("INSERT INTO no_such_table VALUES (1)")
        assert conn.execute("SELECT count(*) FROM probe_dis").fetchone() == (3,)  # round robin: backend 1
        assert conn.execute("SELECT count(*) FROM probe_dis").fetchone() == (3,)  # backend 2, still enabled
        # backend 1 executes it, backend 2 fails (duplicate key): the client succeeds, backend 2 goes
        conn.execute("INSERT INTO u VALUES (1)")
        for _ in range(5):  # round robin, but only backend 1 is left
            conn.execute("SELECT count(*) FROM probe_dis")
        conn.execute("INSERT INTO u VALUES (2)")
    after = seq_scans(pgs, "probe_dis", sum(before) + 7)
    assert [a - b for a, b in zip(after, before)] == [6, 1]
    assert on_each(pgs, "SELECT id FROM u ORDER BY id") == [[(1,), (2,)], [(1,)]]
    assert stats["disabled"] == [pgs[1].address]
    b1, b2 = stats["backends"]
    assert b2["failed_writes"] == 1 and "duplicate key" in b2["disabled_reason"]
    assert b1["enabled"] and b1["failed_writes"] == 0
    assert "DISABLED" in (mw.workdir / "middleware.console.log").read_text()


def test_a_read_waiting_for_a_write_that_disables_its_backend_goes_elsewhere(pair):
    """With wait=first the client has its answer before the slower backend fails the write; a read
    routed there meanwhile waits for that write, and then must not run on a disabled backend."""
    import psycopg

    _, pgs = pair
    fresh_table(pgs, "probe_wait")
    for p in pgs:
        p.sql("DROP TABLE IF EXISTS v", DB)
    pgs[0].sql("CREATE TABLE v (id int)", DB)
    pgs[1].sql(
        "CREATE OR REPLACE FUNCTION slow_no(int) RETURNS bool LANGUAGE plpgsql AS "
        "'BEGIN PERFORM pg_sleep(0.5); RETURN false; END'",
        DB,
    )
    pgs[1].sql("CREATE TABLE v (id int CHECK (slow_no(id)))", DB)  # fails every insert, half a second late
    before = seq_scans(pgs, "probe_wait", 0)
    stats: dict = {}
    with middleware(pair, "rr", stats=stats) as mw, psycopg.connect(dsn(mw), autocommit=True) as conn:
        conn.execute("SELECT count(*) FROM probe_wait")  # round robin: db1, db2 is next
        t0 = time.monotonic()
        conn.execute("INSERT INTO v VALUES (1)")  # answered by db1 at once
        assert time.monotonic() - t0 < 0.4
        for _ in range(4):  # the first is routed to db2, waits for the insert there, then goes to db1
            conn.execute("SELECT count(*) FROM probe_wait")
    after = seq_scans(pgs, "probe_wait", sum(before) + 5)
    assert [a - b for a, b in zip(after, before)] == [5, 0]
    assert stats["disabled"] == [pgs[1].address] and [b["reads"] for b in stats["backends"]] == [5, 0]


@pytest.mark.parametrize("prepare_threshold", [None, 0])
def test_psycopg_with_and_without_prepared_statements(pair, prepare_threshold):
    import psycopg

    _, pgs = pair
    table = f"ps_{prepare_threshold or 'none'}"
    for p in pgs:
        p.sql(f"DROP TABLE IF EXISTS {table}", DB)
    stats: dict = {}
    with middleware(pair, stats=stats) as mw:
        with psycopg.connect(dsn(mw), autocommit=True, prepare_threshold=prepare_threshold) as conn:
            conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, n int)")
            for i in range(6):  # the same statements again and again: prepared after the threshold
                conn.execute(f"INSERT INTO {table} VALUES (%s, %s)", (i, i * i))
                assert conn.execute(f"SELECT n FROM {table} WHERE id = %s", (i,)).fetchone() == (i * i,)
                conn.execute(f"UPDATE {table} SET n = n + 1 WHERE id = %s", (i,))
            assert conn.execute(f"SELECT sum(n) FROM {table}").fetchone() == (sum(i * i + 1 for i in range(6)),)
            conn.execute("DEALLOCATE ALL")
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (6,)
        # explicit transactions: committed on both, rolled back on both
        with psycopg.connect(dsn(mw), prepare_threshold=prepare_threshold) as conn:
            with conn.transaction():
                conn.execute(f"INSERT INTO {table} VALUES (100, 1)")
                assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (7,)
            with pytest.raises(psycopg.errors.UniqueViolation), conn.transaction():
                conn.execute(f"INSERT INTO {table} VALUES (101, 1)")
                conn.execute(f"INSERT INTO {table} VALUES (100, 1)")
            conn.commit()
    # psycopg sent named statements (Parse with a name) only when asked to prepare
    assert (stats["named_statements"] > 0) == (prepare_threshold == 0)
    counts = on_each(pgs, f"SELECT count(*), sum(n) FROM {table}")
    assert counts[0] == counts[1] == [(7, sum(i * i + 1 for i in range(6)) + 1)]


def test_pipeline_mode_and_server_side_cursors(pair):
    """psycopg's pipeline mode flushes and waits for replies before its Sync; a named cursor lives in
    a transaction across units."""
    import psycopg

    _, pgs = pair
    stats: dict = {}
    with middleware(pair, stats=stats) as mw:
        with psycopg.connect(dsn(mw), autocommit=True) as conn:
            conn.execute("DROP TABLE IF EXISTS pl")
            conn.execute("CREATE TABLE pl (id int)")
            with conn.pipeline():
                for i in range(5):
                    conn.execute("INSERT INTO pl VALUES (%s)", (i,))
                assert conn.execute("SELECT count(*) FROM pl").fetchone() == (5,)
            # an error inside a pipeline fails it the same way on both servers: nobody is disabled
            with pytest.raises(psycopg.errors.DivisionByZero), conn.pipeline():
                conn.execute("INSERT INTO pl VALUES (100)")
                conn.execute("SELECT 1/0")
                conn.execute("INSERT INTO pl VALUES (101)")
            assert conn.execute("SELECT 7").fetchone() == (7,)
        with psycopg.connect(dsn(mw)) as conn, conn.cursor(name="walk") as cur:
            cur.execute("SELECT id FROM pl ORDER BY id")
            assert cur.fetchmany(2) == [(0,), (1,)]
            assert cur.fetchall()[:3] == [(2,), (3,), (4,)]
    rows = on_each(pgs, "SELECT id FROM pl ORDER BY id")
    assert rows[0] == rows[1] and [r[0] for r in rows[0]][:5] == [0, 1, 2, 3, 4]
    assert stats["flushed_units"] >= 1 and stats["disabled"] == []


def test_copy_and_unknown_databases_get_clear_errors(pair):
    import psycopg

    with middleware(pair) as mw:
        with psycopg.connect(dsn(mw), autocommit=True) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS cp (id int)")
            with (
                pytest.raises(psycopg.errors.FeatureNotSupported, match="COPY is not supported"),
                conn.cursor().copy("COPY cp FROM STDIN") as cp,
            ):
                cp.write_row((1,))
            assert conn.execute("SELECT 1").fetchone() == (1,)  # the session goes on
        with pytest.raises(psycopg.OperationalError, match='database "other" does not exist'):
            psycopg.connect(psycopg.conninfo.make_conninfo(mw.dsn(), dbname="other"))


def test_a_stale_pooled_connection_does_not_disable_its_backend(pair):
    import psycopg

    _, pgs = pair
    fresh_table(pgs, "probe_stale")
    before = seq_scans(pgs, "probe_stale", 0)
    stats: dict = {}
    with middleware(pair, "rr", stats=stats) as mw, psycopg.connect(dsn(mw), autocommit=True) as conn:
        for _ in range(4):
            conn.execute("SELECT count(*) FROM probe_stale")
        for p in pgs:  # the servers end the middleware's idle sessions (as an idle timeout would)
            ended = p.sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                DB,
                (DB,),
            )
            assert ended and all(r[0] for r in ended)
        for _ in range(4):
            assert conn.execute("SELECT count(*) FROM probe_stale").fetchone() == (3,)
    after = seq_scans(pgs, "probe_stale", sum(before) + 8)
    assert [a - b for a, b in zip(after, before)] == [4, 4]
    assert stats["disabled"] == [] and [b["reads"] for b in stats["backends"]] == [4, 4]


def test_a_backend_that_goes_away_is_disabled_and_reads_go_on(pair):
    import psycopg

    _, pgs = pair
    fresh_table(pgs, "probe_gone")
    stats: dict = {}
    try:
        with middleware(pair, "rr", stats=stats) as mw, psycopg.connect(dsn(mw), autocommit=True) as conn:
            for _ in range(4):  # both backends serve, and each has a pooled connection now
                assert conn.execute("SELECT count(*) FROM probe_gone").fetchone() == (3,)
            pgs[1].stop()
            for _ in range(6):  # every read still answered: the one routed to db2 is retried on db1
                assert conn.execute("SELECT count(*) FROM probe_gone").fetchone() == (3,)
            conn.execute("INSERT INTO probe_gone VALUES (4)")  # only db1 is left to write to
    finally:
        pgs[1].start()
    assert stats["disabled"] == [pgs[1].address] and stats["read_retries"] == 1
    assert "read failed" in stats["backends"][1]["disabled_reason"]
    assert [b["reads"] for b in stats["backends"]] == [2 + 6, 2 + 1]  # the failed attempt counts at db2
    assert on_each(pgs, "SELECT count(*) FROM probe_gone") == [[(4,)], [(3,)]]


# --- real: the RUBBoS application through the middleware ----------------------------------------


def test_rubbos_pages_through_the_middleware(pair):
    from tierscope.apps.rubbos import datagen
    from tierscope.apps.rubbos.provider import WSGI_APP
    from tierscope.services.appserver import AppServer
    from tierscope.services.base import free_port
    from tierscope.testbed.host import Host

    work, pgs = pair
    now = datetime.now().replace(microsecond=0)
    for p in pgs:  # the same rows on both: same seed, scale and load time
        p.create_database("rubbos")
        datagen.load(p.db_config("rubbos"), "tiny", seed=3, now=now)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def get(path, data=None):
        body = urllib.parse.urlencode(data).encode() if data else None
        with opener.open(app.url + path, data=body, timeout=30) as r:
            return r.status, r.read().decode("utf-8", "replace")

    stats: dict = {}
    with middleware(pair, db="rubbos", name="mw-rubbos", stats=stats) as mw:
        app = AppServer(
            Host.loopback("app"),
            free_port(),
            work / "app",
            app=WSGI_APP,
            db=mw.db_config(),
            workers=1,
            threads=4,
            name="app",
        )
        app.start()
        try:
            story = pgs[0].sql(
                "SELECT story_id FROM comments GROUP BY story_id ORDER BY count(*) DESC LIMIT 1", "rubbos"
            )[0][0]
            for path in (
                "/rubbos/StoriesOfTheDay",
                "/rubbos/BrowseCategories",
                f"/rubbos/ViewStory?storyId={story}",
                "/rubbos/OlderStories?daysAgo=1&nbOfStories=20",
            ):
                status, body = get(path)
                assert status == 200 and "Traceback" not in body and "ERROR" not in body, path
            status, body = get(
                "/rubbos/StoreComment",
                {
                    "comment_table": "comments",
                    "storyId": story,
                    "parent": 0,
                    "nickname": "user5",
                    "password": "password5",
                    "subject": "through the middleware",
                    "body": "b",
                },
            )
            assert status == 200 and "successfully stored" in body
        finally:
            app.stop()
    rows = [
        p.sql("SELECT id, writer, story_id, date FROM comments WHERE subject = 'through the middleware'", "rubbos")
        for p in pgs
    ]
    assert len(rows[0]) == 1 and rows[0] == rows[1]
    assert stats["reads"] > 4 and stats["writes"] >= 1 and stats["disabled"] == []


# --- end to end: `tierscope run` with a middleware tier ------------------------------------------


@needs_root
@pytest.mark.skipif(not shutil.which("tcpdump"), reason="tcpdump not installed")
def test_run_with_a_middleware_tier_and_two_database_servers(tmp_path):
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from tierscope.runner import run_experiment
    from tierscope.spec import spec_from_dict

    raw = tomllib.loads((ROOT / "examples" / "specs" / "tiny.toml").read_text())
    raw["topology"] = "1/1/1/2-P"
    raw["mix"] = "read_write"  # writes too: each must reach both database servers
    raw["workload"]["users"] = [10]
    raw["workload"]["run"] = "5s"
    raw.setdefault("soft", {}).setdefault("middleware", {})["labels"] = True  # per-statement times
    spec = spec_from_dict(raw, where="mw", name="mw")
    result = run_experiment(spec, tmp_path, report=False)
    assert result.failed == [] and len(result.done) == 1
    d = result.dir / result.done[0]
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["topology"].startswith("1") and "/1" in manifest["topology"]
    requests = pq.read_table(d / "requests.parquet")
    mw_rows = requests.filter(pc.equal(requests["tier"], "middleware"))
    db_rows = requests.filter(pc.equal(requests["tier"], "db"))
    assert mw_rows.num_rows > 0
    servers = set(db_rows.column("server").to_pylist())
    assert servers == {"db1", "db2"}
    stats = json.loads((d / "mw1" / "middleware.stats.json").read_text())
    assert stats["reads"] > 0 and stats["disabled"] == []
    assert stats["implementation"] == "rust"  # what wrote the stats: tierscope-engine middleware
    assert stats["labels"]["counts"]  # soft.middleware.labels reached --labels
    assert not any("disabled database backend" in n for n in manifest.get("notes", []))
    # what the tracer saw: every statement at the middleware reached at least one database server
    # (a browse-only mix has no writes, which would reach both)
    # what the tracer saw on the bridge: every read at the middleware reached one database server,
    # every write reached both
    writes = ("INSERT", "UPDATE", "DELETE")

    def n_writes(rows, server=None):
        return sum(
            1
            for label, srv in zip(rows.column("label").to_pylist(), rows.column("server").to_pylist())
            if (label or "").startswith(writes) and (server is None or srv == server)
        )

    mw_writes = n_writes(mw_rows)
    assert mw_writes > 0 and mw_writes == stats["writes"]
    assert n_writes(db_rows, "db1") == n_writes(db_rows, "db2") == mw_writes
    assert db_rows.num_rows >= mw_rows.num_rows + mw_writes
    # the middleware's read count agrees with the wire, give or take the app's health checks made
    # before the capture started
    assert mw_rows.num_rows - mw_writes <= stats["reads"] <= mw_rows.num_rows - mw_writes + 10
    assert db_rows.num_rows >= stats["reads"] - 10


@pytest.mark.slow
@needs_root
@pytest.mark.skipif(not shutil.which("tcpdump"), reason="tcpdump not installed")
def test_run_with_two_middleware_servers_spreads_the_app_servers(tmp_path):
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from tierscope.runner import run_experiment
    from tierscope.spec import spec_from_dict

    raw = tomllib.loads((ROOT / "examples" / "specs" / "tiny.toml").read_text())
    raw["topology"] = "1/2/2/2-P"
    raw["workload"]["users"] = [10]
    spec = spec_from_dict(raw, where="mw2", name="mw2")
    result = run_experiment(spec, tmp_path, report=False)
    assert result.failed == [] and len(result.done) == 1
    d = result.dir / result.done[0]
    requests = pq.read_table(d / "requests.parquet")
    mw_rows = requests.filter(pc.equal(requests["tier"], "middleware"))
    assert set(mw_rows.column("server").to_pylist()) == {"mw1", "mw2"}
    for name in ("mw1", "mw2"):  # app1 -> mw1, app2 -> mw2
        stats = json.loads((d / name / "middleware.stats.json").read_text())
        assert stats["reads"] > 0 and stats["disabled"] == []
        traced = int(pc.sum(pc.equal(mw_rows["server"], name)).as_py())
        assert traced <= stats["reads"] + stats["writes"] <= traced + 10


def test_the_runner_notes_a_disabled_backend_in_the_manifest(tmp_path):
    import types

    from tierscope.runner import note_disabled_backends

    stats = {
        "backends": [
            {"name": "10.0.0.2:5432", "enabled": True, "disabled_reason": None, "rejoined": 0},
            {"name": "10.0.0.3:5432", "enabled": False, "disabled_reason": "duplicate key", "rejoined": 0},
            {"name": "10.0.0.4:5432", "enabled": True, "disabled_reason": None, "rejoined": 2},
        ]
    }
    (tmp_path / "middleware.stats.json").write_text(json.dumps(stats))
    mw = types.SimpleNamespace(name="mw1", stats_path=tmp_path / "middleware.stats.json")
    ctx = types.SimpleNamespace(notes=[])
    note_disabled_backends(ctx, mw)
    assert ctx.notes == [
        "mw1 disabled database backend 10.0.0.3:5432: duplicate key",
        "mw1: database backend 10.0.0.4:5432 stopped answering and rejoined 2 time(s) during the point "
        "(replayed from the recovery log first)",
    ]
    missing = types.SimpleNamespace(name="mw2", stats_path=tmp_path / "absent.json")
    note_disabled_backends(ctx, missing)
    assert len(ctx.notes) == 3 and ctx.notes[2].startswith("mw2: no counts written on exit")
