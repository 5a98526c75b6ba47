"""The clustering middleware's MySQL protocol (`tierscope-engine middleware --protocol mysql`) on
real MariaDB.

Pure parts (the MySQL framing, the login exchange, the answer follower, the time functions a write
is run under one `SET timestamp` for): `cargo test` in engine/src/middleware (named below).

Real parts: two MariaDB servers on loopback behind the middleware, PyMySQL clients. The ground
truth for where reads went is each server's own `Com_select` counter (SHOW GLOBAL STATUS);
writes are checked by reading each server directly. The end-to-end test runs `tierscope run` with
topology 1/1/1/2M.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import struct
import tempfile
import threading
import time
import tomllib
from pathlib import Path

import pytest

from conftest import ROOT, needs_root

HAVE_MARIADB = bool(shutil.which("mariadbd") or shutil.which("mysqld") or Path("/usr/sbin/mariadbd").exists())
needs_mariadb = pytest.mark.skipif(not HAVE_MARIADB, reason="MariaDB server not installed")
DB = "mwtest"

# --- pure: `cargo test` (engine/src/middleware), where the Python middleware's cases here went ----
#
# the native-password scramble: mysql_wire.rs sha1_and_the_native_password_scramble_match_their_definitions
# the greeting and the login: mysql_wire.rs the_greeting_and_the_login_round_trip
# packets split at 16 MiB, length-encoded integers: mysql_wire.rs packets_split_at_16_mib_and_integers_are_length_encoded
# the answer follower: mysql_wire.rs the_answer_follower_finds_the_end_of_ok_err_and_result_sets
# the time functions: mysql_wire.rs time_functions_are_counted_outside_literals_and_comments
# MySQL's locking reads (LOCK IN SHARE MODE, GET_LOCK): engine/tests/sql_cases.json (sql.rs
#   classification_matches_the_shared_cases; pytest through the running middleware,
#   tests/test_middleware_sql_cases.py)

#: the commands of the binary protocol the prepared-statement client below sends
COM_STMT_PREPARE, COM_STMT_EXECUTE, COM_STMT_CLOSE = 0x16, 0x17, 0x19


def test_a_mariadb_topology_with_a_middleware_tier_is_accepted():
    from tierscope.runner import PointFailed, check_db_topology
    from tierscope.spec import spec_from_dict

    check_db_topology("mariadb", 2, 1)
    with pytest.raises(PointFailed, match="a Galera cluster replicates by itself"):
        check_db_topology("galera", 2, 1)
    from tierscope.contracts.dbms import dbms
    from tierscope.spec import SpecError, expand

    raw = tomllib.loads((ROOT / "examples" / "specs" / "tiny.toml").read_text())
    raw["topology"] = "1/1/1/2M"
    points = expand(spec_from_dict(raw, where="m", name="m"))
    assert len(points) == len(raw["workload"]["users"])  # one point per workload level
    config = points[0].config
    # 1/1/1/2M: one web, one app, one middleware, two MariaDB servers behind it, which it speaks
    # MySQL to (the letter M)
    assert [(s.name, s.tier) for s in config.servers()] == [
        ("web1", "web"),
        ("app1", "app"),
        ("mw1", "middleware"),
        ("db1", "db"),
        ("db2", "db"),
    ]
    assert config.dbms == "mariadb" and dbms(config.dbms).protocol == "mysql"
    raw["topology"] = "1/1/0/2M"  # two MariaDB servers without the middleware: not replicas of anything
    with pytest.raises(SpecError, match="no clustering middleware"):
        spec_from_dict(raw, where="m", name="m")


def test_help_names_the_protocols_and_what_is_not_supported():
    import subprocess

    from tierscope.services.middleware import engine_middleware

    out = subprocess.run([*engine_middleware(), "--help"], capture_output=True, text=True, check=True).stdout
    assert "--protocol" in out and "TIERSCOPE_MIDDLEWARE_PASSWORD" in out
    assert "Cursors (COM_STMT_FETCH) and COM_STMT_SEND_LONG_DATA are answered with ERR 1235" in out


# --- real: two MariaDB servers behind the middleware ---------------------------------------------


@pytest.fixture(scope="module")
def pair():
    """Two MariaDB servers on loopback, each with an empty database `mwtest`."""
    if not HAVE_MARIADB:
        pytest.skip("MariaDB server not installed")
    from tierscope.services.base import free_port
    from tierscope.services.mariadb import MariaDB
    from tierscope.testbed.host import Host

    work = Path(tempfile.mkdtemp(prefix="tierscope-mwmy-test-"))  # the mysql user must reach it
    dbs = [
        MariaDB(
            Host.loopback(f"db{i}"),
            free_port(),
            work / f"db{i}",
            durable=False,
            buffer_pool="32M",
            max_connections=60,
            name=f"db{i}",
        )
        for i in (1, 2)
    ]
    try:
        for d in dbs:
            d.start()
            d.create_database(DB)
        yield work, dbs
    finally:
        for d in dbs:
            d.stop()
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module", autouse=True)
def engine_built():
    """The middleware's binary (`tierscope.engine.engine_path()`: $TIERSCOPE_ENGINE, else the venv's;
    built by `make setup`): a missing one fails the tests here, never skips them."""
    from tierscope.engine import EngineNotFound, engine_path

    try:
        exe = engine_path()
    except EngineNotFound as err:
        pytest.fail(str(err))
    if not exe.exists():
        pytest.fail(f"{exe} does not exist; run `make setup`")


@contextlib.contextmanager
def middleware(pair, policy="lprf", name="mw", stats=None, wait="first"):
    """The middleware (`tierscope-engine middleware --protocol mysql`) in front of both servers;
    `stats` receives its counts after it stops."""
    from tierscope.services.base import free_port
    from tierscope.services.middleware import Middleware
    from tierscope.testbed.host import Host

    work, dbs = pair
    mw = Middleware(
        Host.loopback(name),
        free_port(),
        work / name,
        backends=[d.address for d in dbs],
        database=DB,
        user=dbs[0].credentials.user,
        password=dbs[0].credentials.password,
        dbms="mariadb",
        pool=4,
        policy=policy,
        wait=wait,
        name=name,
    )
    mw.start()
    try:
        yield mw
    finally:
        mw.stop()
        if stats is not None and mw.stats_path.exists():
            stats.update(mw.stats())


def connect(mw, **kw):
    import pymysql

    c = mw.db_config()
    args = dict(host=c.host, port=c.port, user=c.user, password=c.password, database=c.database, autocommit=True)
    args["read_timeout"] = 20  # a lost answer fails the test instead of hanging it
    return pymysql.connect(**{**args, **kw})


def fresh_table(dbs, name, rows=3):
    """A probe table with the same rows on both servers, created directly (not through the proxy)."""
    for d in dbs:
        d.sql(f"DROP TABLE IF EXISTS {name}", DB)
        d.sql(f"CREATE TABLE {name} (id INT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(40), at DATETIME(6))", DB)
        for i in range(1, rows + 1):
            d.sql(f"INSERT INTO {name} (v) VALUES ('row{i}')", DB)


def com_select(dbs) -> list[int]:
    """Each server's count of SELECT statements (its own counter; SHOW is not counted in it)."""
    return [int(d.sql("SHOW GLOBAL STATUS LIKE 'Com_select'")[0][1]) for d in dbs]


def rows(dbs, table):
    return [d.sql(f"SELECT id, v, at FROM {table} ORDER BY id", DB) for d in dbs]


def test_sequential_reads_go_to_the_first_backend_under_lprf_and_alternate_under_rr(pair):
    _, dbs = pair
    fresh_table(dbs, "probe_reads")
    for policy, expected in (("lprf", [6, 0]), ("rr", [3, 3])):
        stats: dict = {}
        with middleware(pair, policy, stats=stats) as mw:
            conn = connect(mw)
            before = com_select(dbs)
            with conn.cursor() as cur:
                for _ in range(6):
                    cur.execute("SELECT count(*) FROM probe_reads")
                    assert cur.fetchone() == (3,)
            after = com_select(dbs)
            conn.close()
        assert [a - b for a, b in zip(after, before)] == expected, policy
        assert [b["reads"] for b in stats["backends"]] == expected and stats["protocol"] == "mysql"
        assert stats["implementation"] == "rust"
        assert stats["reads"] == 6 and stats["disabled"] == []


def test_writes_land_on_both_servers_with_one_now_and_the_same_ids(pair):
    _, dbs = pair
    fresh_table(dbs, "probe_writes", rows=0)
    stats: dict = {}
    with middleware(pair, "rr", stats=stats) as mw:
        conn = connect(mw)
        with conn.cursor() as cur:
            ids = []
            for i in range(5):
                assert cur.execute("INSERT INTO probe_writes (v, at) VALUES (%s, NOW(6))", (f"w{i}",)) == 1
                ids.append(cur.lastrowid)
            assert cur.execute("UPDATE probe_writes SET v = CONCAT(v, '!') WHERE id > 2") == 3
            assert cur.execute("DELETE FROM probe_writes WHERE id = 1") == 1
            cur.execute("SELECT at FROM probe_writes WHERE id = 2")
            assert cur.fetchone()[0] is not None
        conn.close()
    assert ids == [1, 2, 3, 4, 5]
    r = rows(dbs, "probe_writes")
    assert r[0] == r[1] and [x[1] for x in r[0]] == ["w1", "w2!", "w3!", "w4!"]
    assert len({x[2] for x in r[0]}) == 4  # four instants, each the same on both servers (microseconds)
    assert stats["writes"] == 7 and stats["macros_rewritten"] == 5 and stats["disabled"] == []
    assert [b["writes"] for b in stats["backends"]] == [7, 7]


def test_transactions_commit_and_roll_back_on_both_servers(pair):
    _, dbs = pair
    fresh_table(dbs, "probe_txn", rows=0)
    stats: dict = {}
    with middleware(pair, "rr", stats=stats) as mw:
        conn = connect(mw)
        with conn.cursor() as cur:
            conn.begin()  # BEGIN
            cur.execute("INSERT INTO probe_txn (v) VALUES ('rolled back')")
            cur.execute("SELECT count(*) FROM probe_txn")  # inside: its own insert is seen
            assert cur.fetchone() == (1,)
            conn.rollback()
            cur.execute("START TRANSACTION")
            cur.execute("INSERT INTO probe_txn (v) VALUES ('committed')")
            cur.execute("COMMIT")
            conn.autocommit(False)  # SET AUTOCOMMIT = 0: the session keeps its connections
            cur.execute("INSERT INTO probe_txn (v) VALUES ('autocommit off')")
            other = connect(mw)  # another client's read is not blocked, and does not see it
            with other.cursor() as cur2:
                cur2.execute("SELECT count(*) FROM probe_txn")
                assert cur2.fetchone() == (1,)
            conn.commit()
            conn.autocommit(True)
            with other.cursor() as cur2:
                cur2.execute("SELECT v FROM probe_txn ORDER BY id")
                assert cur2.fetchall() == (("committed",), ("autocommit off",))
            other.close()
        conn.close()
    r = rows(dbs, "probe_txn")
    assert r[0] == r[1] and [x[1] for x in r[0]] == ["committed", "autocommit off"]
    assert stats["transaction_units"] >= 6 and stats["disabled"] == []


def test_errors_pass_through_with_their_mysql_codes(pair):
    import pymysql

    _, dbs = pair
    fresh_table(dbs, "probe_errors", rows=1)
    stats: dict = {}
    with middleware(pair, "rr", stats=stats) as mw:
        conn = connect(mw)
        with conn.cursor() as cur:
            with pytest.raises(pymysql.err.ProgrammingError) as e:
                cur.execute("SELEC 1")
            assert e.value.args[0] == 1064
            with pytest.raises(pymysql.err.ProgrammingError) as e:
                cur.execute("SELECT * FROM no_such_table")
            assert e.value.args[0] == 1146
            with pytest.raises(pymysql.err.IntegrityError) as e:  # on both servers alike: nobody disabled
                cur.execute("INSERT INTO probe_errors (id, v) VALUES (1, 'dup')")
            assert e.value.args[0] == 1062
            cur.execute("SELECT v FROM probe_errors")  # the session goes on
            assert cur.fetchall() == (("row1",),)
            cur.execute("SELECT @@socket")  # answered here: no backend's socket to go around the middleware
            assert cur.fetchall() == (("",),)
            conn.ping()
            conn.select_db(DB)
            with pytest.raises(pymysql.err.OperationalError) as e:
                conn.select_db("elsewhere")
            assert e.value.args[0] == 1049
        conn.close()
        with pytest.raises(pymysql.err.OperationalError) as e:
            connect(mw, password="wrong")
        assert e.value.args[0] == 1045
        with pytest.raises(pymysql.err.OperationalError) as e:
            connect(mw, database="elsewhere")
        assert e.value.args[0] == 1049
    assert stats["disabled"] == [] and stats["errors_to_clients"] == 4


class Prepared:
    """A server-side prepared statement driven over PyMySQL's connection (binary protocol, BIGINT
    parameters): the types are bound on the first execute only, as clients do."""

    def __init__(self, conn, sql_text: str):
        self.conn = conn
        conn._execute_command(COM_STMT_PREPARE, sql_text)
        ok = conn._read_packet()
        self.id, self.columns, self.params = struct.unpack("<xIHH", ok.read(9))
        for _ in range(self.params + (1 if self.params else 0)):
            conn._read_packet()  # parameter definitions, EOF
        for _ in range(self.columns + (1 if self.columns else 0)):
            conn._read_packet()  # column definitions, EOF
        self.bound = False

    def execute(self, *ints: int, flags: int = 0) -> list[bytes] | int:
        """The binary rows, or the affected rows of an OK."""
        n = len(ints)
        payload = struct.pack("<IBI", self.id, flags, 1)
        if n:
            payload += bytes((n + 7) // 8) + (b"\x00" if self.bound else b"\x01" + b"\x08\x00" * n)
            payload += b"".join(struct.pack("<q", v) for v in ints)
        self.bound = True
        self.conn._execute_command(COM_STMT_EXECUTE, payload)
        first = self.conn._read_packet()
        if first.is_ok_packet():
            return first.read_length_encoded_integer() if first.read(1) is not None else 0
        ncols = first.read_length_encoded_integer()
        for _ in range(ncols):
            self.conn._read_packet()
        self.conn._read_packet()  # EOF after the column definitions
        rows = []
        while True:
            q = self.conn._read_packet()
            if q.is_eof_packet():
                return rows
            rows.append(q.get_all_data())

    def close(self) -> None:
        self.conn._execute_command(COM_STMT_CLOSE, struct.pack("<I", self.id))


def com(dbs, what) -> list[int]:
    return [int(d.sql(f"SHOW GLOBAL STATUS LIKE '{what}'")[0][1]) for d in dbs]


def test_prepared_statements_read_by_policy_and_write_everywhere(pair):
    import pymysql

    _, dbs = pair
    fresh_table(dbs, "probe_ps", rows=4)
    stats: dict = {}
    with middleware(pair, "rr", stats=stats) as mw:
        conn = connect(mw)
        before = com(dbs, "Com_stmt_execute")
        sel = Prepared(conn, "SELECT v FROM probe_ps WHERE id = ?")
        assert sel.params == 1 and sel.columns == 1
        got = [sel.execute(i % 4 + 1) for i in range(6)]  # types bound on the first only
        assert all(len(r) == 1 for r in got)
        assert [r[0][-4:] for r in got[:4]] == [b"row1", b"row2", b"row3", b"row4"]
        after = com(dbs, "Com_stmt_execute")
        assert [a - b for a, b in zip(after, before)] == [3, 3]  # round robin, each server its share
        ins = Prepared(conn, "INSERT INTO probe_ps (v, at) VALUES (CONCAT('ps', ?), NOW(6))")
        assert [ins.execute(k) for k in (1, 2, 3)] == [1, 1, 1]
        upd = Prepared(conn, "UPDATE probe_ps SET v = CONCAT(v, '!') WHERE id > ?")
        assert upd.execute(5) == 2
        sel.close()
        ins.close()
        upd.close()
        # errors: a statement that does not prepare, an unknown id, a cursor
        with pytest.raises(pymysql.err.ProgrammingError) as e:
            Prepared(conn, "SELEC ?")
        assert e.value.args[0] == 1064
        with pytest.raises(pymysql.err.MySQLError) as e:
            sel.execute(1)  # closed
        assert e.value.args[0] == 1243
        cur_stmt = Prepared(conn, "SELECT 1")
        with pytest.raises(pymysql.err.MySQLError) as e:
            cur_stmt.execute(flags=1)  # CURSOR_TYPE_READ_ONLY
        assert e.value.args[0] == 1235 and "cursors" in e.value.args[1]
        with conn.cursor() as cur:  # the session goes on
            cur.execute("SELECT count(*) FROM probe_ps")
            assert cur.fetchone() == (7,)
        conn.close()
    r = rows(dbs, "probe_ps")
    assert r[0] == r[1] and [x[1] for x in r[0][4:]] == ["ps1", "ps2!", "ps3!"]
    assert len({x[2] for x in r[0][4:]}) == 3  # NOW(6) the same on both, per execute
    assert stats["disabled"] == [] and stats["named_statements"] == 5


def kill(db) -> None:
    """SIGKILL the server (no shutdown), then forget the process."""
    os.killpg(db.proc.pid, signal.SIGKILL)
    db.proc.wait(timeout=10)
    db.stop()


def test_a_backend_killed_mid_run_is_disabled_and_the_clients_go_on(pair):
    """Writers run all along; a read sleeping on db2 when db2 is SIGKILLed is retried on db1 (the
    client sees only its answer); the writes go on on db1 alone."""
    _, dbs = pair
    fresh_table(dbs, "probe_kill", rows=3)
    stats: dict = {}
    errors: list = []
    inserted = [0]
    lock = threading.Lock()
    stop = threading.Event()
    slept: list = []

    def writer(mw, k):
        try:
            conn = connect(mw)
            with conn.cursor() as cur:
                while not stop.is_set():
                    cur.execute("INSERT INTO probe_kill (v) VALUES (%s)", (f"c{k}",))
                    with lock:
                        inserted[0] += 1
            conn.close()
        except Exception as err:  # what the test counts
            errors.append(repr(err))

    def sleeper(conn):
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT SLEEP(2), count(*) >= 3 FROM probe_kill")
                slept.append(cur.fetchone())
        except Exception as err:
            errors.append(repr(err))

    try:
        with middleware(pair, "rr", stats=stats) as mw:
            threads = [threading.Thread(target=writer, args=(mw, k)) for k in range(3)]
            for t in threads:
                t.start()
            conn = connect(mw)
            with conn.cursor() as cur:
                cur.execute("SELECT count(*) FROM probe_kill")  # round robin: db1
            s = threading.Thread(target=sleeper, args=(conn,))  # and db2
            s.start()
            time.sleep(0.8)
            before_kill = inserted[0]
            kill(dbs[1])
            s.join(30)
            with conn.cursor() as cur:
                for _ in range(3):
                    cur.execute("SELECT count(*) >= 3 FROM probe_kill")
                    assert cur.fetchone() == (1,)
            time.sleep(0.5)
            stop.set()
            for t in threads:
                t.join(30)
            conn.close()
    finally:
        dbs[1].start()
    assert errors == [] and slept == [(0, 1)]
    assert before_kill > 0 and inserted[0] > before_kill  # writes went on after the kill
    assert stats["disabled"] == [dbs[1].address] and stats["read_retries"] == 1
    b1, b2 = stats["backends"]
    assert b1["enabled"] and not b2["enabled"] and "failed" in b2["disabled_reason"]
    assert [b1["reads"], b2["reads"]] == [1 + 1 + 3, 1]  # the sleeping read's failed attempt counts at db2
    count = [int(d.sql("SELECT count(*) FROM probe_kill", DB)[0][0]) for d in dbs]
    assert count[0] == 3 + inserted[0]  # every write the clients were answered for is on db1
    assert count[1] < count[0]  # db2 missed the writes after it died


# --- end to end: `tierscope run` with MariaDB behind a middleware tier ---------------------------


@needs_root("the runner's hosts are network namespaces")
@needs_mariadb
def test_run_with_a_middleware_tier_and_two_mariadb_servers(tmp_path):
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from tierscope.runner import run_experiment
    from tierscope.spec import spec_from_dict

    raw = tomllib.loads((ROOT / "examples" / "specs" / "tiny.toml").read_text())
    raw["topology"] = "1/1/1/2M"
    raw["mix"] = "read_write"  # writes too: each must reach both database servers
    raw["workload"]["users"] = [10]
    raw["workload"]["run"] = "5s"
    raw.setdefault("soft", {})["middleware"] = {"policy": "rr"}
    spec = spec_from_dict(raw, where="mwm", name="mwm")
    result = run_experiment(spec, tmp_path, report=False)
    assert result.failed == [] and len(result.done) == 1, result.failed
    d = result.dir / result.done[0]
    manifest = json.loads((d / "manifest.json").read_text())
    servers = {s["server"]: s for s in manifest["servers"]}
    assert servers["mw1"]["protocol"] == servers["db1"]["protocol"] == "mysql"
    assert not any("disabled database backend" in n for n in manifest.get("notes", []))
    client = pq.read_table(d / "client_requests.parquet")
    served = client.filter(pc.equal(client["status"], 200)).num_rows
    assert served > 20 and served >= 0.95 * client.num_rows, (served, client.num_rows)
    stats = json.loads((d / "mw1" / "middleware.stats.json").read_text())
    assert stats["protocol"] == "mysql" and stats["implementation"] == "rust" and stats["disabled"] == []
    reads = [b["reads"] for b in stats["backends"]]
    assert len(reads) == 2 and all(r > 10 for r in reads), reads
    assert stats["writes"] > 0 and all(b["writes"] == stats["writes"] for b in stats["backends"])
    # the tracer on the bridge: statements reached both database servers, writes reached both
    requests = pq.read_table(d / "requests.parquet")
    db = requests.filter(pc.equal(requests["tier"], "db"))
    assert set(db.column("server").to_pylist()) == {"db1", "db2"}
    print(f"mariadb behind the middleware: {served} pages, reads per backend {reads}, writes {stats['writes']}")
