"""Ground truth for the tracer on PostgreSQL: real PostgreSQL 15 and pgbench on loopback, captured
by tcpdump; statement and transaction counts are compared with pgbench's own report, in the
simple and the extended query protocol, and a bad statement must come out labelled as an error."""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tierscope.services.base import free_port
from tierscope.testbed.host import Host
from tierscope.trace.capture import LiveCapture
from tierscope.trace.run import trace_capture

PGBENCH = shutil.which("pgbench") or next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/pgbench"))), None)

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="tcpdump on lo needs root"),
    pytest.mark.skipif(shutil.which("tcpdump") is None, reason="tcpdump not installed (make setup)"),
    pytest.mark.skipif(not list(Path("/usr/lib/postgresql").glob("*/bin/postgres")), reason="PostgreSQL not installed"),
    pytest.mark.skipif(PGBENCH is None, reason="pgbench not installed"),
]

PORT = free_port()
DB = "tracebench"

SCRIPT = """\\set aid random(1, 100)
BEGIN;
SELECT abalance FROM tiny WHERE aid = :aid;
UPDATE tiny SET abalance = abalance + 1 WHERE aid = :aid;
END;
"""
LABELS = {
    "BEGIN": 1,
    "SELECT abalance FROM tiny WHERE aid = ?": 1,
    "UPDATE tiny SET abalance = abalance + ? WHERE aid = ?": 1,
    "END": 1,
}


CREDENTIALS: dict[str, str] = {}


@pytest.fixture(scope="module")
def postgres(tmp_path_factory):
    from tierscope.services.postgres import Postgres

    base = tmp_path_factory.mktemp("trace-pg")
    with Postgres(Host.loopback(), PORT, base / "pg", fsync=False) as pg:
        CREDENTIALS.update(pg.credentials.env())  # pgbench's user and password: PGUSER, PGPASSWORD
        pg.create_database(DB)
        pg.sql("CREATE TABLE tiny (aid int PRIMARY KEY, abalance int NOT NULL DEFAULT 0)", DB)
        pg.sql("INSERT INTO tiny SELECT g, 0 FROM generate_series(1, 100) g", DB)
        yield pg


def pgbench(tmp_path: Path, mode: str, script: str, clients: int, tx: int) -> subprocess.CompletedProcess:
    f = tmp_path / f"script-{mode}.sql"
    f.write_text(script)
    return subprocess.run(
        [
            str(PGBENCH),
            "-n",
            "-h",
            "127.0.0.1",
            "-p",
            str(PORT),
            "-M",
            mode,
            "-c",
            str(clients),
            "-t",
            str(tx),
            "-f",
            str(f),
            DB,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **CREDENTIALS},
    )


def processed(out: str) -> int:
    m = re.search(r"number of transactions actually processed: (\d+)", out)
    assert m, out
    return int(m.group(1))


@pytest.mark.parametrize("mode", ["simple", "extended"])
def test_statement_and_transaction_counts_equal_pgbench(postgres, tmp_path, mode):
    pcap = tmp_path / "pg.pcap"
    with LiveCapture("lo", pcap, filter=f"tcp port {PORT}") as cap:
        out = pgbench(tmp_path, mode, SCRIPT, clients=3, tx=40)
    assert out.returncode == 0, out.stderr
    assert cap.last_stats.dropped_by_kernel == 0
    tx = processed(out.stdout)
    assert tx == 120
    res = trace_capture(pcap, tmp_path / "requests.parquet")
    rows = pq.read_table(res.output).to_pylist()
    by_label = collections.Counter(r["label"] for r in rows)
    for label, per_tx in LABELS.items():
        assert by_label[label] == per_tx * tx, (label, by_label)
    # nothing else: connection startup and authentication are not requests
    assert sum(by_label.values()) == len(LABELS) * tx, by_label
    assert all(r["status"] == "OK" for r in rows)
    assert all(r["protocol"] == "postgres" and r["tier"] == "db" for r in rows)
    assert not any(r["inferred"] for r in rows)
    # pgbench opens one more connection of its own before the clients' (no statements on it)
    assert len({r["conn"] for r in rows}) == 3
    # transactions: BEGIN ... END per connection, in order, never interleaved on one connection
    per_conn: dict[int, list[str]] = collections.defaultdict(list)
    for r in sorted(rows, key=lambda r: r["arrival_ns"]):
        per_conn[r["conn"]].append(r["label"])
    assert sum(seq.count("BEGIN") for seq in per_conn.values()) == tx
    for seq in per_conn.values():
        assert seq == [
            "BEGIN",
            "SELECT abalance FROM tiny WHERE aid = ?",
            "UPDATE tiny SET abalance = abalance + ? WHERE aid = ?",
            "END",
        ] * (len(seq) // 4)
    for r in rows:
        assert r["departure_ns"] > r["arrival_ns"]
        assert r["bytes_in"] > 0 and r["bytes_out"] > 0


@pytest.mark.parametrize("mode", ["simple", "extended"])
def test_bad_statement_is_labelled_as_an_error(postgres, tmp_path, mode):
    script = "SELECT 1;\nSELECT * FROM no_such_table WHERE x = :client_id;\n"
    pcap = tmp_path / "err.pcap"
    with LiveCapture("lo", pcap, filter=f"tcp port {PORT}"):
        out = pgbench(tmp_path, mode, script, clients=1, tx=1)
    assert "no_such_table" in out.stderr  # pgbench saw the error and aborted the client
    res = trace_capture(pcap, tmp_path / "requests.parquet")
    rows = sorted(pq.read_table(res.output).to_pylist(), key=lambda r: r["arrival_ns"])
    assert [(r["label"], r["status"]) for r in rows] == [
        ("SELECT ?", "OK"),
        ("SELECT * FROM no_such_table WHERE x = ?", "42P01"),  # undefined_table
    ]


def test_snaplen_256_delimits_long_statements_and_marks_them(postgres, tmp_path):
    long_sql = "SELECT abalance FROM tiny WHERE aid IN (" + ", ".join(str(i) for i in range(1, 90)) + ");\n"
    assert len(long_sql) > 300
    pcap = tmp_path / "short.pcap"
    with LiveCapture("lo", pcap, filter=f"tcp port {PORT}", snaplen=256):
        out = pgbench(tmp_path, "extended", long_sql + "SELECT 1;\n", clients=2, tx=10)
    assert out.returncode == 0, out.stderr
    res = trace_capture(pcap, tmp_path / "requests.parquet")
    rows = pq.read_table(res.output).to_pylist()
    assert len(rows) == 2 * 2 * 10
    long_rows = [r for r in rows if r["label"] != "SELECT ?"]
    assert len(long_rows) == 20
    assert all(r["truncated"] and r["label"].endswith("[truncated]") for r in long_rows)
    assert all(r["label"].startswith("SELECT abalance FROM tiny WHERE aid IN (") for r in long_rows)
    assert all(r["status"] == "OK" for r in rows)
