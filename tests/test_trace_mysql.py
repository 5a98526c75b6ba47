"""Ground truth for the tracer on MySQL/MariaDB: real MariaDB on loopback, a PyMySQL client sending
text queries and binary-protocol prepared statements (COM_STMT_PREPARE / COM_STMT_EXECUTE /
COM_STMT_CLOSE, sent through PyMySQL's connection after its handshake), captured by tcpdump;
query counts, error codes and times are compared with the client's own log."""

from __future__ import annotations

import collections
import os
import shutil
import struct
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tierscope.services.base import free_port
from tierscope.testbed.host import Host
from tierscope.trace.capture import LiveCapture
from tierscope.trace.run import trace_capture

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="tcpdump on lo needs root"),
    pytest.mark.skipif(shutil.which("tcpdump") is None, reason="tcpdump not installed (make setup)"),
    pytest.mark.skipif(
        not (shutil.which("mariadbd") or shutil.which("mysqld") or Path("/usr/sbin/mariadbd").exists()),
        reason="MariaDB server not installed",
    ),
]

PORT = free_port()  # a port nothing listens on: parallel runs do not collide
DB = "tracedb"
COM_STMT_PREPARE, COM_STMT_EXECUTE, COM_STMT_CLOSE = 0x16, 0x17, 0x19


@pytest.fixture(scope="module")
def mariadb(tmp_path_factory):
    from tierscope.services.mariadb import MariaDB

    base = tmp_path_factory.mktemp("trace-mariadb")
    with MariaDB(Host.loopback(), PORT, base / "mariadb", durable=False) as db:
        db.create_database(DB)
        db.sql("CREATE TABLE kv (k INT PRIMARY KEY, v VARCHAR(64))", DB)
        db.sql("INSERT INTO kv SELECT seq, CONCAT('value-', seq) FROM seq_1_to_100", DB)
        yield db


class Prepared:
    """A server-side prepared statement driven over PyMySQL's connection (binary protocol)."""

    def __init__(self, conn, sql: str):
        self.conn = conn
        conn._execute_command(COM_STMT_PREPARE, sql)
        ok = conn._read_packet()
        self.id, self.columns, self.params = struct.unpack("<xIHH", ok.read(9))
        for _ in range(self.params + (1 if self.params else 0)):
            conn._read_packet()  # parameter definitions, EOF
        for _ in range(self.columns + (1 if self.columns else 0)):
            conn._read_packet()  # column definitions, EOF

    def execute(self, *ints: int) -> list[bytes]:
        n = len(ints)
        payload = struct.pack("<IBI", self.id, 0, 1)
        payload += bytes((n + 7) // 8) + b"\x01" + b"\x08\x00" * n + b"".join(struct.pack("<q", v) for v in ints)
        self.conn._execute_command(COM_STMT_EXECUTE, payload)
        first = self.conn._read_packet()
        rows = []
        if first.is_ok_packet():
            return rows
        ncols = first.read_length_encoded_integer()
        for _ in range(ncols):
            self.conn._read_packet()
        self.conn._read_packet()  # EOF after the column definitions
        while True:
            p = self.conn._read_packet()
            if p.is_eof_packet():
                return rows
            rows.append(p.get_all_data())

    def close(self) -> None:
        self.conn._execute_command(COM_STMT_CLOSE, struct.pack("<I", self.id))


def test_query_and_prepared_statement_counts_errors_and_times(mariadb, tmp_path):
    import pymysql

    pcap = tmp_path / "my.pcap"
    times = []  # (label, start_ns, end_ns) as the client saw them
    with LiveCapture("lo", pcap, filter=f"tcp port {PORT}"):
        conn = pymysql.connect(**mariadb.connect_args(DB), autocommit=True)
        with conn.cursor() as cur:
            for i in range(1, 31):
                t0 = time.time_ns()
                cur.execute("SELECT v FROM kv WHERE k = %s", (i,))
                assert cur.fetchone() == (f"value-{i}",)
                times.append(("SELECT v FROM kv WHERE k = ?", t0, time.time_ns()))
            for i in range(5):
                cur.execute("UPDATE kv SET v = %s WHERE k IN (%s, %s, %s)", (f"u{i}", i + 1, i + 2, i + 3))
            cur.execute("SELECT 1 /* request_id='req%2F7' */")
            with pytest.raises(pymysql.err.ProgrammingError):
                cur.execute("SELECT * FROM no_such_table")
        stmt = Prepared(conn, "SELECT v FROM kv WHERE k = ?")
        for i in range(1, 21):
            t0 = time.time_ns()
            assert len(stmt.execute(i)) == 1
            times.append(("SELECT v FROM kv WHERE k = ?", t0, time.time_ns()))
        stmt.close()
        conn.close()
    res = trace_capture(pcap, tmp_path / "requests.parquet")
    rows = sorted(pq.read_table(res.output).to_pylist(), key=lambda r: r["arrival_ns"])
    labels = collections.Counter(r["label"] for r in rows)
    assert labels["SELECT v FROM kv WHERE k = ?"] == 30 + 20  # text queries + binary executes
    assert labels["PREPARE SELECT v FROM kv WHERE k = ?"] == 1
    assert labels["UPDATE kv SET v = ? WHERE k IN (?+)"] == 5
    assert labels["SELECT ?"] == 1
    assert labels["SELECT * FROM no_such_table"] == 1
    # PyMySQL's own statement at connect; nothing else: the handshake is not a request, and
    # COM_STMT_CLOSE and COM_QUIT have no answer (only counted)
    assert labels["SET NAMES utf8mb4"] == 1
    assert sum(labels.values()) == 50 + 1 + 5 + 1 + 1 + 1, labels
    assert res.stats["parsers"]["no_response_commands"] == 2
    status = {r["label"]: r["status"] for r in rows}
    assert status["SELECT * FROM no_such_table"] == "1146"  # ER_NO_SUCH_TABLE
    assert status["SELECT v FROM kv WHERE k = ?"] == "OK"
    assert [r["request_id"] for r in rows if r["label"] == "SELECT ?"] == ["req/7"]
    assert all(r["protocol"] == "mysql" and r["tier"] == "db" for r in rows)
    assert not any(r["inferred"] for r in rows)
    timed = [r for r in rows if r["label"] == "SELECT v FROM kv WHERE k = ?"]
    slack = []
    for (_label, t0, t1), r in zip(times, timed):
        assert t0 - 1 <= r["arrival_ns"] <= r["departure_ns"] <= t1 + 1
        slack += [r["arrival_ns"] - t0, t1 - r["departure_ns"]]
    # the wire saw each exchange close to the client's own times (the median; a busy machine may
    # deschedule the client now and then)
    assert sorted(slack)[len(slack) // 2] < 2_000_000


def test_snaplen_256_large_results_are_still_delimited(mariadb, tmp_path):
    import pymysql

    pcap = tmp_path / "short.pcap"
    with LiveCapture("lo", pcap, filter=f"tcp port {PORT}", snaplen=256):
        conn = pymysql.connect(**mariadb.connect_args(DB), autocommit=True)
        with conn.cursor() as cur:
            for i in range(10):
                cur.execute("SELECT k, REPEAT(v, 40) FROM kv WHERE k <= %s", (20 + i,))
                assert len(cur.fetchall()) == 20 + i
        conn.close()
    res = trace_capture(pcap, tmp_path / "requests.parquet")
    rows = pq.read_table(res.output).to_pylist()
    big = [r for r in rows if r["label"] == "SELECT k, REPEAT(v, ?) FROM kv WHERE k <= ?"]
    assert len(big) == 10
    big.sort(key=lambda r: r["arrival_ns"])
    # each query returns one more row than the last: k (2 digits) and 'value-NN' x 40 (320 bytes)
    # = 4 (packet header) + 1 + 2 + 3 (length prefix of 320) + 320 = 330 bytes, counted from the
    # wire lengths although only 256 bytes of each packet were captured
    assert [b["bytes_out"] - a["bytes_out"] for a, b in zip(big, big[1:])] == [330] * 9
    assert all(r["departure_ns"] > r["arrival_ns"] and r["status"] == "OK" for r in big)
    # the rows' ends were found at the next command (direction change) and say so
    assert all("delimited_by_turn" in r["flags"] for r in big)
