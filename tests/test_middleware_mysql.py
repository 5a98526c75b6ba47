"""The clustering middleware's MySQL protocol (tierscope.middleware.mysql_server) on real MariaDB.

Pure parts: the MySQL framing, the login exchange (mysql_native_password), the answer follower
and the time functions a write is run under one `SET timestamp` for.

Real parts: two MariaDB servers on loopback behind the middleware, PyMySQL clients; each case runs
with both implementations (`impl`: the Python middleware and the Rust one, `tierscope-engine
middleware --protocol mysql`). The ground
truth for where reads went is each server's own `Com_select` counter (SHOW GLOBAL STATUS);
writes are checked by reading each server directly. The end-to-end test runs `tierscope run` with
topology 1/1/1/2M.
"""

from __future__ import annotations

import contextlib
import hashlib
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
from tierscope.middleware import mysql_wire as my
from tierscope.middleware import sql
from tierscope.middleware.mysql_server import time_functions

HAVE_MARIADB = bool(shutil.which("mariadbd") or shutil.which("mysqld") or Path("/usr/sbin/mariadbd").exists())
needs_mariadb = pytest.mark.skipif(not HAVE_MARIADB, reason="MariaDB server not installed")
DB = "mwtest"

# --- pure ----------------------------------------------------------------------------------------


def test_native_password_scramble_matches_the_definition():
    salt = bytes(range(1, 21))
    h1 = hashlib.sha1(b"secret").digest()
    h3 = hashlib.sha1(salt + hashlib.sha1(h1).digest()).digest()
    assert my.scramble_native("secret", salt) == bytes(a ^ b for a, b in zip(h1, h3))
    assert my.scramble_native("", salt) == b""


def test_greeting_and_login_round_trip():
    salt = b"abcdefghijklmnopqrst"
    hs = my.parse_handshake(my.handshake_v10(7, salt, "5.5.5-10.11.6-MariaDB"))
    assert hs.version == "5.5.5-10.11.6-MariaDB" and hs.connection_id == 7 and hs.salt == salt
    assert hs.plugin == my.NATIVE_PASSWORD and hs.caps & my.PROTOCOL_41 and not hs.caps & my.DEPRECATE_EOF
    assert hs.status == my.STATUS_AUTOCOMMIT
    auth = my.scramble_native("pw", salt)
    login = my.parse_login(my.handshake_response(my.BACKEND_CAPS, "tierscope", auth, "rubbos"))
    assert (login.user, login.auth, login.database, login.plugin) == ("tierscope", auth, "rubbos", my.NATIVE_PASSWORD)
    assert my.parse_login(my.handshake_response(my.BACKEND_CAPS, "u", b"", None)).database is None


def test_packets_split_at_16_mib_and_frame_back():
    big = b"\x03" + b"x" * my.MAX_PAYLOAD
    data = my.packet(0, big)
    n1, s1 = my.header(data)
    n2, s2 = my.header(data, 4 + n1)
    assert (n1, s1, n2, s2) == (my.MAX_PAYLOAD, 0, 1, 1) and len(data) == len(big) + 8
    assert my.lenenc_int(my.lenenc(300), 0) == (300, 3) and my.lenenc_int(my.lenenc(1 << 30), 0) == (1 << 30, 9)


def feed(r: my.Response, payloads: list[bytes]) -> my.Response:
    for p in payloads:
        r.feed(p[0] if p else -1, len(p), p)
    return r


def test_the_answer_follower_finds_the_end_of_ok_err_and_result_sets():
    r = feed(my.Response(), [my.ok(3, 9, my.STATUS_AUTOCOMMIT | my.STATUS_IN_TRANS)])
    assert r.done and r.ok and r.tags == ["OK 3"] and r.status == my.STATUS_AUTOCOMMIT | my.STATUS_IN_TRANS
    r = feed(my.Response(), [my.err(1064, "syntax", "42000")])
    assert r.done and not r.ok and r.error == "ERROR 1064 (42000): syntax"
    # two columns, a row starting with a 0xFE-prefixed long string (not an EOF: 9 bytes and more), EOF
    result = [b"\x02", b"coldef1", b"coldef2", my.eof(), b"\x011\x012", b"\xfe" + b"\0" * 8 + b"x", my.eof()]
    r = my.Response()
    for i, p in enumerate(result):
        assert not r.done, i
        r.feed(p[0], len(p), p)
    assert r.done and r.tags == ["ROWS 2"]
    # two results (a multi-statement): the first EOF says more results exist
    r = feed(my.Response(), [my.ok(1, 0, my.STATUS_AUTOCOMMIT | my.STATUS_MORE_RESULTS)])
    assert not r.done
    feed(r, [b"\x01", b"c", my.eof(), b"\x011", my.eof()])
    assert r.done and r.tags == ["OK 1", "ROWS 1"]
    r = feed(my.Response(), [b"\x01", b"c", my.eof(), b"\x011", my.err(1317, "interrupted", "70100")])
    assert r.done and not r.ok and "1317" in r.error


def test_time_functions_and_mysql_locking_reads():
    assert time_functions("INSERT INTO t VALUES (NOW(), CURDATE(), 'now()') /* now() */") == 2
    assert time_functions("UPDATE t SET a = UNIX_TIMESTAMP() + 1") == 1
    assert time_functions("INSERT INTO t VALUES (SYSDATE())") == 0  # reads the clock: not fixable
    assert sql.classify("SELECT * FROM t WHERE id = 1 LOCK IN SHARE MODE") == sql.WRITE
    assert sql.classify("SELECT GET_LOCK('x', 1)") == sql.WRITE
    assert sql.classify("SELECT * FROM t WHERE id = 1") == sql.READ


def test_a_mariadb_topology_with_a_middleware_tier_is_accepted():
    from tierscope.runner import PointFailed, check_db_topology
    from tierscope.spec import spec_from_dict

    check_db_topology("mariadb", 2, 1)
    with pytest.raises(PointFailed, match="a Galera cluster replicates by itself"):
        check_db_topology("galera", 2, 1)
    from tierscope.services.middleware import PROTOCOLS
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
    assert config.dbms == "mariadb" and PROTOCOLS[config.dbms] == "mysql"
    raw["topology"] = "1/1/0/2M"  # two MariaDB servers without the middleware: not replicas of anything
    with pytest.raises(SpecError, match="no clustering middleware"):
        spec_from_dict(raw, where="m", name="m")


def test_help_names_the_protocols_and_what_is_not_supported():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "tierscope.middleware", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "--protocol" in out and "TIERSCOPE_MIDDLEWARE_PASSWORD" in out
    assert "COM_STMT_FETCH) and\nCOM_STMT_SEND_LONG_DATA are answered with ERR 1235" in out


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


@pytest.fixture(params=["python", "rust"])
def impl(request):
    """Each implementation of the MySQL-protocol middleware in turn: the Python one and the Rust one
    (the binary from `tierscope.engine.engine_path()`: $TIERSCOPE_ENGINE, else the venv's; built by
    `make setup`; a missing one fails the rust cases)."""
    if request.param == "rust":
        from tierscope.engine import engine_path

        exe = engine_path()
        if not exe.exists():
            pytest.fail(f"{exe} does not exist; run `make setup`")
    return request.param


@contextlib.contextmanager
def middleware(pair, policy="lprf", name="mw", stats=None, wait="first", implementation="python"):
    """The middleware (MySQL protocol; `implementation` python or rust, `tierscope-engine middleware
    --protocol mysql`) in front of both servers; `stats` receives its counts after it stops."""
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
        implementation=implementation,
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


def test_sequential_reads_go_to_the_first_backend_under_lprf_and_alternate_under_rr(pair, impl):
    _, dbs = pair
    fresh_table(dbs, "probe_reads")
    for policy, expected in (("lprf", [6, 0]), ("rr", [3, 3])):
        stats: dict = {}
        with middleware(pair, policy, stats=stats, implementation=impl) as mw:
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
        assert stats["implementation"] == impl
        assert stats["reads"] == 6 and stats["disabled"] == []


def test_writes_land_on_both_servers_with_one_now_and_the_same_ids(pair, impl):
    _, dbs = pair
    fresh_table(dbs, "probe_writes", rows=0)
    stats: dict = {}
    with middleware(pair, "rr", stats=stats, implementation=impl) as mw:
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


def test_transactions_commit_and_roll_back_on_both_servers(pair, impl):
    _, dbs = pair
    fresh_table(dbs, "probe_txn", rows=0)
    stats: dict = {}
    with middleware(pair, "rr", stats=stats, implementation=impl) as mw:
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


def test_errors_pass_through_with_their_mysql_codes(pair, impl):
    import pymysql

    _, dbs = pair
    fresh_table(dbs, "probe_errors", rows=1)
    stats: dict = {}
    with middleware(pair, "rr", stats=stats, implementation=impl) as mw:
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
        conn._execute_command(my.COM_STMT_PREPARE, sql_text)
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
        self.conn._execute_command(my.COM_STMT_EXECUTE, payload)
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
        self.conn._execute_command(my.COM_STMT_CLOSE, struct.pack("<I", self.id))


def com(dbs, what) -> list[int]:
    return [int(d.sql(f"SHOW GLOBAL STATUS LIKE '{what}'")[0][1]) for d in dbs]


def test_prepared_statements_read_by_policy_and_write_everywhere(pair, impl):
    import pymysql

    _, dbs = pair
    fresh_table(dbs, "probe_ps", rows=4)
    stats: dict = {}
    with middleware(pair, "rr", stats=stats, implementation=impl) as mw:
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


def test_a_backend_killed_mid_run_is_disabled_and_the_clients_go_on(pair, impl):
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
        with middleware(pair, "rr", stats=stats, implementation=impl) as mw:
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
def test_run_with_a_middleware_tier_and_two_mariadb_servers(tmp_path, impl):
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from tierscope.runner import run_experiment
    from tierscope.spec import spec_from_dict

    raw = tomllib.loads((ROOT / "examples" / "specs" / "tiny.toml").read_text())
    raw["topology"] = "1/1/1/2M"
    raw["mix"] = "read_write"  # writes too: each must reach both database servers
    raw["workload"]["users"] = [10]
    raw["workload"]["run"] = "5s"
    raw.setdefault("soft", {})["middleware"] = {"policy": "rr", "implementation": impl}
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
    assert stats["protocol"] == "mysql" and stats["implementation"] == impl and stats["disabled"] == []
    reads = [b["reads"] for b in stats["backends"]]
    assert len(reads) == 2 and all(r > 10 for r in reads), reads
    assert stats["writes"] > 0 and all(b["writes"] == stats["writes"] for b in stats["backends"])
    # the tracer on the bridge: statements reached both database servers, writes reached both
    requests = pq.read_table(d / "requests.parquet")
    db = requests.filter(pc.equal(requests["tier"], "db"))
    assert set(db.column("server").to_pylist()) == {"db1", "db2"}
    print(f"mariadb behind the middleware: {served} pages, reads per backend {reads}, writes {stats['writes']}")
