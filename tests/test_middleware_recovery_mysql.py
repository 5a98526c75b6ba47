"""Replicas that cannot drift, MySQL protocol (issue 25 item 2): the Rust middleware's recovery log
in front of MariaDB, end to end.

Two MariaDB servers behind `tierscope-engine middleware --protocol mysql --recovery-log PATH`.
Clients write (explicit transactions in text, autocommit text statements, prepared statements in
and out of transactions, statements that fail everywhere) while backend 2 is stopped; the
middleware disables it and goes on. Backend 2 comes back stale; a new middleware over both, with
the same log, replays the missing units to it before it listens, so every table's checksum
(MariaDB's own CHECKSUM TABLE) and the positions (`tierscope_recovery.seq`) are equal on both
servers the moment it serves, and reads are then balanced over both (each server's own
Com_select counter). Given an empty log instead, the stale backend is refused with one message
naming it and both positions, and no read reaches it; a backend whose AUTO_INCREMENT counter is
ahead of the others' after the replay is refused too.

The binary is the lab's (`tierscope.engine.engine_path()`: $TIERSCOPE_ENGINE, else the venv's); a
missing one fails these tests.
"""

from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

import test_middleware_mysql
from test_middleware_rust import engine_built, rust_middleware, wait_for_log  # noqa: F401  (engine_built: autouse)
from tierscope.contracts.middleware import PASSWORD_ENV
from tierscope.engine import engine_path

HAVE_MARIADB = bool(shutil.which("mariadbd") or shutil.which("mysqld") or Path("/usr/sbin/mariadbd").exists())
pytestmark = pytest.mark.skipif(not HAVE_MARIADB, reason="MariaDB server not installed")

DB = "mwtest"
ACCOUNTS = 40
COM_STMT_PREPARE, COM_STMT_EXECUTE = 0x16, 0x17


#: this module's own pair of MariaDB servers (tests/test_middleware_mysql.py's fixture)
servers = test_middleware_mysql.pair


def mysql_middleware(servers, log: Path, stats=None, wait="first"):
    """wait="all" where a test stops backend 2 right after a write: it has run there first."""
    return rust_middleware(
        servers, "rr", wait=wait, stats=stats, extra=["--protocol", "mysql", "--recovery-log", str(log)]
    )


def connect(mw, **kw):
    import pymysql

    args = dict(host=mw.host, port=mw.port, user=mw.user, password=mw.password, database=DB, autocommit=True)
    return pymysql.connect(**{**args, "read_timeout": 20, **kw})


def checksums(dbs) -> list[dict]:
    """Per server: every table of the database and MariaDB's CHECKSUM TABLE of it (the recovery
    table, holding the position, included)."""
    out = []
    for d in dbs:
        tables = sorted(r[0] for r in d.sql("SHOW TABLES", DB))
        out.append({t: d.sql(f"CHECKSUM TABLE `{t}`", DB)[0][1] for t in tables})
    return out


def positions(dbs) -> list[int]:
    return [d.sql("SELECT seq FROM tierscope_recovery", DB)[0][0] for d in dbs]


def com_select(dbs) -> list[int]:
    return [int(d.sql("SHOW GLOBAL STATUS LIKE 'Com_select'")[0][1]) for d in dbs]


class Prepared:
    """A server-side prepared statement over PyMySQL's connection (binary protocol, BIGINT
    parameters; the types bound on the first execute only, as clients do)."""

    def __init__(self, conn, sql_text: str):
        self.conn = conn
        conn._execute_command(COM_STMT_PREPARE, sql_text)
        ok = conn._read_packet()
        ok.check_error()
        self.id, self.columns, self.params = struct.unpack("<xIHH", ok.read(9))
        for _ in range(self.params + (1 if self.params else 0)):
            conn._read_packet()
        for _ in range(self.columns + (1 if self.columns else 0)):
            conn._read_packet()
        self.bound = False

    def execute(self, *ints: int) -> int:
        """The affected rows (the statement must answer with an OK)."""
        n = len(ints)
        payload = struct.pack("<IBI", self.id, 0, 1)
        payload += bytes((n + 7) // 8) + (b"\x00" if self.bound else b"\x01" + b"\x08\x00" * n)
        payload += b"".join(struct.pack("<q", v) for v in ints)
        self.bound = True
        self.conn._execute_command(COM_STMT_EXECUTE, payload)
        first = self.conn._read_packet()
        first.check_error()
        assert first.is_ok_packet()
        first.read(1)
        return first.read_length_encoded_integer()


def make_schema(mw) -> None:
    """The tables and their rows, through the middleware: logged like any write."""
    with connect(mw) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE racc (id INT PRIMARY KEY, abalance BIGINT NOT NULL)")
        cur.execute(
            "CREATE TABLE rhist (id INT AUTO_INCREMENT PRIMARY KEY, aid INT, delta INT, at DATETIME(6), note VARCHAR(20))"
        )
        cur.execute("INSERT INTO racc VALUES " + ", ".join(f"({i}, 0)" for i in range(1, ACCOUNTS + 1)))
        cur.execute("CREATE TABLE probe (id INT PRIMARY KEY)")
        cur.execute("INSERT INTO probe VALUES (1), (2), (3)")


def write_load(mw, stop: threading.Event, errors: list, counts: list) -> list[threading.Thread]:
    """Three writers through the middleware until `stop`: explicit transactions in text (with
    NOW(6) and an AUTO_INCREMENT), autocommit prepared statements and prepared statements inside
    transactions, autocommit text statements with one that fails everywhere now and then."""
    import pymysql

    def transactions():
        try:
            with connect(mw) as conn, conn.cursor() as cur:
                i = 0
                while not stop.is_set():
                    aid, delta = 1 + i % ACCOUNTS, (i * 7) % 11 - 5
                    conn.begin()
                    cur.execute("UPDATE racc SET abalance = abalance + %s WHERE id = %s", (delta, aid))
                    cur.execute("SELECT abalance FROM racc WHERE id = %s", (aid,))
                    cur.execute("INSERT INTO rhist (aid, delta, at, note) VALUES (%s, %s, NOW(6), 'txn')", (aid, delta))
                    if i % 5 == 4:
                        conn.rollback()
                    else:
                        conn.commit()
                    counts[0] += 1
                    i += 1
        except Exception as e:  # pragma: no cover - reported by the test
            errors.append(f"transactions: {e!r}")

    def prepared():
        try:
            with connect(mw) as conn:
                upd = Prepared(conn, "UPDATE racc SET abalance = abalance + ? WHERE id = ?")
                ins = Prepared(conn, "INSERT INTO rhist (aid, delta, note) VALUES (?, ?, 'prep')")
                i = 0
                while not stop.is_set():
                    aid = 1 + (i * 3) % ACCOUNTS
                    if i % 3 == 2:
                        conn.begin()
                        upd.execute(2, aid)
                        ins.execute(aid, 2)
                        conn.commit()
                    else:
                        assert upd.execute(1, aid) == 1
                    counts[1] += 1
                    i += 1
        except Exception as e:  # pragma: no cover
            errors.append(f"prepared: {e!r}")

    def autocommit():
        try:
            with connect(mw) as conn, conn.cursor() as cur:
                i = 0
                while not stop.is_set():
                    cur.execute(
                        "INSERT INTO rhist (aid, delta, at, note) VALUES (%s, 1, NOW(6), 'auto')", (1 + i % ACCOUNTS,)
                    )
                    if i % 4 == 3:
                        with pytest.raises(pymysql.err.IntegrityError):
                            cur.execute("INSERT INTO probe VALUES (1)")  # fails everywhere: logged, position kept
                    counts[2] += 1
                    i += 1
        except Exception as e:  # pragma: no cover
            errors.append(f"autocommit: {e!r}")

    threads = [threading.Thread(target=f, daemon=True) for f in (transactions, prepared, autocommit)]
    for t in threads:
        t.start()
    return threads


def reset(dbs) -> None:
    for d in dbs:
        d.sql("DROP TABLE IF EXISTS racc, rhist, probe, tierscope_recovery", DB)


def kill(db) -> None:
    """SIGKILL the server (no shutdown: InnoDB recovers at the next start), then forget the process."""
    os.killpg(db.proc.pid, signal.SIGKILL)
    db.proc.wait(timeout=10)
    db.stop()


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_a_backend_that_was_down_is_replayed_to_the_head_before_it_serves(servers, how):
    work, dbs = servers
    reset(dbs)
    log_path = work / f"recovery-1-{how}" / "recovery.log"
    errors: list = []
    counts = [0, 0, 0]
    stats1: dict = {}
    try:
        with mysql_middleware(servers, log_path, stats1) as mw:
            make_schema(mw)
            stop = threading.Event()
            threads = write_load(mw, stop, errors, counts)
            time.sleep(1.0)
            before_stop = list(counts)
            if how == "stop":  # backend 2 goes away; the writes go on on backend 1
                dbs[1].stop()
            else:
                kill(dbs[1])
            time.sleep(1.5)
            stop.set()
            for t in threads:
                t.join(timeout=30)
        assert not errors, errors
        assert all(c > b + 5 for b, c in zip(before_stop, counts)), (before_stop, counts)
        assert stats1["disabled"] == [dbs[1].address]
        assert stats1["recovery"]["positions_at_start"] == {d.address: 0 for d in dbs}
    finally:
        dbs[1].start()
    stale = checksums(dbs)
    stale_pos = positions(dbs)
    assert stale[0] != stale[1] and stale_pos[1] < stale_pos[0], (stale, stale_pos)  # backend 2 is behind
    # the up-to-date backend's position is a unit of the log (a transaction's units included)
    assert log_path.stat().st_size > 0

    stats2: dict = {}
    with mysql_middleware(servers, log_path, stats2) as mw:
        text = mw.log.read_text()
        now = checksums(dbs)  # taken before any query: the replay happened before it listened
        now_pos = positions(dbs)
        before = com_select(dbs)
        with connect(mw) as conn, conn.cursor() as cur:
            for _ in range(6):
                cur.execute("SELECT count(*) FROM probe")
                assert cur.fetchone() == (3,)
            cur.execute("UPDATE racc SET abalance = abalance + 1")
        after = com_select(dbs)
    assert "REFUSED" not in text, text
    assert "replayed from" in text, text
    data = [{t: c for t, c in x.items() if t != "tierscope_recovery"} for x in (now[0], stale[0])]
    assert data[0] == data[1]  # nothing lost from backend 1 (its position may have moved to the head)
    print(f"recovery: positions {stale_pos} -> {now_pos}; {stats2['recovery']}")  # seen with -s
    assert now[0] == now[1], (now, stale)  # every table, MariaDB's own checksum
    assert now_pos[0] == now_pos[1] >= stale_pos[0], now_pos
    assert [a - b for a, b in zip(after, before)] == [3, 3]  # both replicas serve again
    rec = stats2["recovery"]
    assert rec["positions_at_start"] == {dbs[0].address: stale_pos[0], dbs[1].address: stale_pos[1]}
    assert rec["replayed"][dbs[1].address]["units"] >= 1
    assert stats2["disabled"] == []
    end = checksums(dbs)
    assert end[0] == end[1] and positions(dbs)[0] == positions(dbs)[1]  # and take writes alike
    sums = [d.sql("SELECT sum(abalance) FROM racc", DB)[0][0] for d in dbs]
    assert sums[0] == sums[1]


def test_a_backend_that_comes_back_while_serving_rejoins_at_the_head_and_is_never_read_stale(servers):
    """Backend 2 stops and comes back while the middleware serves: it is tried every second and,
    once the log has brought it to the head under the write lock, serves again. A reader counts the
    history rows through the middleware the whole time: a read from a stale backend would see fewer
    rows than an earlier one did."""
    work, dbs = servers
    reset(dbs)
    errors: list = []
    counts = [0, 0, 0]
    seen: list[int] = []
    stats: dict = {}
    stop, stop_reader = threading.Event(), threading.Event()

    def reader(mw):
        try:
            with connect(mw) as conn, conn.cursor() as cur:
                while not stop_reader.is_set():
                    cur.execute("SELECT count(*) FROM rhist")
                    seen.append(cur.fetchone()[0])
        except Exception as e:  # pragma: no cover - reported by the test
            errors.append(f"reader: {e!r}")

    try:
        with mysql_middleware(servers, work / "recovery-rejoin" / "recovery.log", stats) as mw:
            make_schema(mw)
            threads = write_load(mw, stop, errors, counts)
            threads.append(threading.Thread(target=reader, args=(mw,), daemon=True))
            threads[-1].start()
            time.sleep(1.0)
            dbs[1].stop()
            wait_for_log(mw, "DISABLED", 20)
            time.sleep(1.0)
            behind = list(counts)
            dbs[1].start()
            wait_for_log(mw, "REJOINED", 30)
            rejoined_at = len(seen)
            time.sleep(1.5)
            stop.set()
            for t in threads[:-1]:
                t.join(timeout=30)
            stop_reader.set()
            threads[-1].join(timeout=30)
            before = com_select(dbs)
            with connect(mw) as conn, conn.cursor() as cur:
                for _ in range(6):
                    cur.execute("SELECT count(*) FROM probe")
                    assert cur.fetchone() == (3,)
            after = com_select(dbs)
            text = mw.log.read_text()
    finally:
        if not dbs[1].running():
            dbs[1].start()
    assert not errors, errors
    assert all(c > b + 3 for b, c in zip(behind, counts)), (behind, counts)  # writes after it came back
    assert len(seen) > rejoined_at > 10 and all(a <= b for a, b in zip(seen, seen[1:])), seen
    line = next(x for x in text.splitlines() if "REJOINED" in x)
    assert dbs[1].address in line and int(line.split("REJOINED: ")[1].split(" units")[0]) >= 1, line
    assert [a - b for a, b in zip(after, before)] == [3, 3]  # both replicas serve again
    assert stats["disabled"] == [] and stats["backends"][1]["rejoined"] == 1, stats["backends"]
    end = checksums(dbs)
    assert end[0] == end[1] and positions(dbs)[0] == positions(dbs)[1], end


def test_a_stale_backend_the_log_cannot_bring_back_is_refused_and_never_read(servers):
    work, dbs = servers
    reset(dbs)
    try:
        with mysql_middleware(servers, work / "recovery-2a" / "recovery.log", wait="all") as mw:
            make_schema(mw)
            dbs[1].stop()
            with connect(mw) as conn, conn.cursor() as cur:
                for i in range(5):
                    cur.execute("UPDATE racc SET abalance = abalance + 1 WHERE id = %s", (i + 1,))
    finally:
        dbs[1].start()
    pos = positions(dbs)
    assert pos[1] < pos[0], pos
    # a new middleware with another (empty) log: the units backend 2 misses are nowhere
    stats: dict = {}
    with mysql_middleware(servers, work / "recovery-2b" / "recovery.log", stats) as mw:
        text = mw.log.read_text()
        refusals = [line for line in text.splitlines() if "REFUSED" in line]
        before = com_select(dbs)
        with connect(mw) as conn, conn.cursor() as cur:
            for _ in range(6):
                cur.execute("SELECT count(*) FROM probe")
                assert cur.fetchone() == (3,)
            cur.execute("UPDATE racc SET abalance = abalance + 1 WHERE id = 1")
        after = com_select(dbs)
    assert len(refusals) == 1, text
    assert dbs[1].address in refusals[0]
    assert f"its position is {pos[1]}, the head is {pos[0]}" in refusals[0], refusals[0]
    assert "is empty" in refusals[0], refusals[0]
    assert [a - b for a, b in zip(after, before)] == [6, 0]  # the stale one is never read
    assert stats["disabled"] == [dbs[1].address]
    assert "REFUSED" in stats["backends"][1]["disabled_reason"]
    # nor written: backend 2 is as it was
    assert positions(dbs)[1] == pos[1]
    assert [[tuple(r) for r in d.sql("SELECT abalance FROM racc WHERE id = 1", DB)] for d in dbs] == [[(2,)], [(0,)]]


def test_a_unit_that_failed_on_one_backend_leaves_its_position_and_is_replayed_only_when_it_succeeds(servers):
    """A write that fails on backend 2 only (a row there the other lacks: a duplicate key) disables
    it without moving its position; a new middleware replays that unit, and refuses backend 2 while
    the unit still fails there (its outcome differs from the others'); once the stray row is gone,
    the replay brings it to the head with equal checksums."""
    work, dbs = servers
    reset(dbs)
    log_path = work / "recovery-3" / "recovery.log"
    stats: dict = {}
    with mysql_middleware(servers, log_path, stats) as mw:
        make_schema(mw)
        before = positions(dbs)
        dbs[1].sql("INSERT INTO probe VALUES (9)", DB)  # behind the middleware's back
        with connect(mw) as conn, conn.cursor() as cur:
            cur.execute("INSERT INTO probe VALUES (9)")  # backend 1 answers; backend 2 fails
            cur.execute("UPDATE racc SET abalance = 5 WHERE id = 1")
    assert stats["disabled"] == [dbs[1].address]
    assert "Duplicate entry" in stats["backends"][1]["disabled_reason"]
    after = positions(dbs)
    assert after[1] == before[1] and after[0] == before[0] + 2, (before, after)  # the failed unit left it

    with mysql_middleware(servers, log_path) as mw:
        text = mw.log.read_text()
    refusals = [line for line in text.splitlines() if "REFUSED" in line]
    assert len(refusals) == 1 and dbs[1].address in refusals[0], text
    assert "failed here" in refusals[0] and "Duplicate entry" in refusals[0], refusals[0]
    assert positions(dbs) == after  # nothing moved: the unit rolled back there again

    dbs[1].sql("DELETE FROM probe WHERE id = 9", DB)
    stats2: dict = {}
    with mysql_middleware(servers, log_path, stats2) as mw:
        text = mw.log.read_text()
        now = checksums(dbs)
    assert "REFUSED" not in text and stats2["disabled"] == [], text
    # (the start that refused it appended a ROLLBACK record: the head is one further)
    assert now[0] == now[1] and positions(dbs)[0] == positions(dbs)[1] >= after[0], (now, positions(dbs))
    assert stats2["recovery"]["replayed"][dbs[1].address]["units"] >= 2


def auto_increment(d, table: str) -> int:
    """The table's AUTO_INCREMENT counter (the next value) on server `d`."""
    q = "SELECT AUTO_INCREMENT FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s"
    return d.sql(q, DB, (DB, table))[0][0]


def test_a_backend_whose_auto_increment_counter_differs_after_the_replay_is_refused(servers):
    """Values backend 2 took alone (a row inserted and deleted behind the middleware's back: InnoDB
    does not give the values back, as after a transaction it was running when it went down) leave
    its `rhist` counter ahead. The replay gives the missing rows the others' ids (`SET insert_id`):
    the rows are alike, the counters are not, and the next INSERT would give a row another id there.
    A new middleware compares the counters after the replay: backend 2 is refused, naming the
    table and both counters, and its position is -1 (refused at every later start)."""
    work, dbs = servers
    reset(dbs)
    log_path = work / "recovery-4" / "recovery.log"
    try:
        with mysql_middleware(servers, log_path, wait="all") as mw:
            make_schema(mw)
            dbs[1].stop()
            with connect(mw) as conn, conn.cursor() as cur:
                for i in range(3):
                    cur.execute("INSERT INTO rhist (aid, delta, note) VALUES (%s, 1, 'auto')", (i + 1,))
    finally:
        dbs[1].start()
    pos = positions(dbs)
    assert pos[1] < pos[0], pos
    dbs[1].sql("INSERT INTO rhist (aid, delta, note) VALUES " + ", ".join(f"({i}, 1, 'x')" for i in range(1, 6)), DB)
    dbs[1].sql("DELETE FROM rhist", DB)
    ahead, head = auto_increment(dbs[1], "rhist"), auto_increment(dbs[0], "rhist")
    assert (ahead, head) == (6, 4), (ahead, head)

    stats: dict = {}
    with mysql_middleware(servers, log_path, stats) as mw:
        text = mw.log.read_text()
        with connect(mw) as conn, conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM rhist")
            assert cur.fetchone() == (3,)
    refusals = [line for line in text.splitlines() if "REFUSED" in line]
    print(f"recovery: {refusals}")  # seen with -s
    assert len(refusals) == 1 and dbs[1].address in refusals[0], text
    assert "AUTO_INCREMENT counters differ" in refusals[0], refusals[0]
    assert f"`rhist`: {ahead} against {head}" in refusals[0], refusals[0]
    assert stats["disabled"] == [dbs[1].address]
    assert stats["recovery"]["replayed"] == {}
    # the replay ran (the rows are the others'), the counter stayed ahead, the position is refused
    rows = [[tuple(r) for r in d.sql("SELECT id, aid FROM rhist ORDER BY id", DB)] for d in dbs]
    assert rows[0] == rows[1] == [(1, 1), (2, 2), (3, 3)], rows
    assert auto_increment(dbs[1], "rhist") == ahead
    assert positions(dbs)[1] == -1

    with mysql_middleware(servers, log_path) as mw:
        text = mw.log.read_text()
    assert "tierscope_recovery.seq is -1" in text, text


def test_the_command_line_takes_a_recovery_log_with_the_mysql_protocol(tmp_path):
    """`--recovery-log` is no longer refused with `--protocol mysql` (it was a usage error, exit 2):
    the middleware opens the log and goes on to its backends (none answers here: exit 1)."""
    log = tmp_path / "sub" / "r.log"
    argv = [str(engine_path()), "middleware", "--protocol", "mysql", "--listen", "127.0.0.1:1"]
    argv += ["--backend", "127.0.0.1:2", "--recovery-log", str(log), "--connect-timeout", "0.3"]
    out = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, PASSWORD_ENV: "pw"}, timeout=60)
    assert out.returncode == 1 and "no database backend answered" in out.stderr, out.stderr
    assert "PostgreSQL only" not in out.stderr and log.exists()
