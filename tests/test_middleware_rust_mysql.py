"""The Rust middleware's MySQL protocol (`tierscope-engine middleware --protocol mysql`,
engine/src/middleware/mysql_session.rs) on real MariaDB, driven by the real `mariadb` command-line
client.

The cases with PyMySQL clients (reads by policy, writes, transactions, errors, prepared
statements, a backend killed mid-run) are in tests/test_middleware_mysql.py; here: the same
middleware with a client that is not PyMySQL (libmariadb's), and its command line and lab wiring.

Ground truth: each MariaDB server's own `Com_select` counter for where reads went, each server's
rows for writes (read directly, not through the middleware). The binary is the lab's
(`tierscope.engine.engine_path()`: $TIERSCOPE_ENGINE, else the venv's; `make setup` builds it); a
missing one fails these tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib

import pytest

import test_middleware_mysql as mym
from conftest import ROOT
from test_middleware_mysql import DB, com_select, fresh_table, middleware, rows
from test_middleware_rust import assert_stats_keep_the_contract
from tierscope.engine import engine_path

#: the two MariaDB servers of tests/test_middleware_mysql.py (its module-scoped fixture; this module
#: gets its own pair)
pair = mym.pair

pytestmark = pytest.mark.skipif(not shutil.which("mariadb"), reason="the mariadb client is not installed")


@pytest.fixture(scope="module", autouse=True)
def engine_built():
    exe = engine_path()
    if not exe.exists():
        pytest.fail(f"{exe} does not exist; run `make setup`")
    out = subprocess.run([str(exe), "middleware", "--help"], capture_output=True, text=True)
    if out.returncode != 0 or "--protocol" not in out.stdout:
        pytest.fail(f"{exe} has no `middleware --protocol` (rebuild: make setup): {out.stderr.strip()[:300]}")


def client(mw, sql: str, user: str | None = None, password: str | None = None, database: str | None = DB):
    """Run `sql` with the mariadb command-line client through the middleware (TCP, batch mode):
    (exit code, stdout, stderr). The password goes in MYSQL_PWD, not on the command line."""
    c = mw.db_config()
    argv = [
        "mariadb",
        "--protocol=tcp",
        "-h",
        c.host,
        "-P",
        str(c.port),
        "-u",
        user or c.user,
        "--batch",
        "--skip-column-names",
    ]
    argv += ["--connect-timeout=10", "-e", sql]
    if database:
        argv.append(database)
    env = {**os.environ, "MYSQL_PWD": c.password if password is None else password}
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    return out.returncode, out.stdout, out.stderr


def rust(pair, policy="rr", stats=None):
    return middleware(pair, policy, name=f"rmw-{policy}", stats=stats)


def test_reads_spread_over_both_replicas_by_their_own_counters(pair):
    _, dbs = pair
    fresh_table(dbs, "r_reads", rows=3)
    stats: dict = {}
    with rust(pair, "rr", stats) as mw:
        before = com_select(dbs)
        code, out, err = client(mw, "SELECT count(*) FROM r_reads; " * 8)
        after = com_select(dbs)
    assert code == 0, err
    assert out.split() == ["3"] * 8
    spread = [a - b for a, b in zip(after, before)]
    assert spread == [4, 4], spread  # round robin, counted by each MariaDB itself
    assert stats["implementation"] == "rust" and stats["protocol"] == "mysql"
    assert [b["reads"] for b in stats["backends"]] == spread and stats["disabled"] == []
    assert_stats_keep_the_contract(stats)


def test_writes_land_on_both_replicas_with_one_now(pair):
    _, dbs = pair
    fresh_table(dbs, "r_writes", rows=0)
    stats: dict = {}
    with rust(pair, "lprf", stats) as mw:
        sql = "".join(f"INSERT INTO r_writes (v, at) VALUES ('w{i}', NOW(6)); " for i in range(4))
        code, _, err = client(
            mw, sql + "UPDATE r_writes SET v = CONCAT(v, '!') WHERE id > 2; DELETE FROM r_writes WHERE id = 1"
        )
    assert code == 0, err
    per = rows(dbs, "r_writes")
    assert [len(r) for r in per] == [3, 3]  # row counts from each replica
    assert per[0] == per[1]  # the same ids, values and NOW(6) (microseconds) on both
    assert [x[1] for x in per[0]] == ["w1", "w2!", "w3!"]
    assert len({x[2] for x in per[0]}) == 3 and all(x[2] is not None for x in per[0])
    assert stats["writes"] == 6 and stats["macros_rewritten"] == 4
    assert [b["writes"] for b in stats["backends"]] == [6, 6] and stats["disabled"] == []


def test_a_transaction_stays_on_one_connection_per_replica(pair):
    _, dbs = pair
    fresh_table(dbs, "r_txn", rows=0)
    stats: dict = {}
    with rust(pair, "rr", stats) as mw:
        # each statement records the backend connection it ran on; the SELECT inside sees the
        # uncommitted rows only on the transaction's own connection
        code, out, err = client(
            mw,
            "BEGIN; INSERT INTO r_txn (v) VALUES (CONNECTION_ID()); SELECT count(*) FROM r_txn; "
            "INSERT INTO r_txn (v) VALUES (CONNECTION_ID()); SELECT count(*) FROM r_txn; COMMIT; "
            "START TRANSACTION; INSERT INTO r_txn (v) VALUES ('rolled back'); ROLLBACK",
        )
    assert code == 0, err
    assert out.split() == ["1", "2"]
    per = rows(dbs, "r_txn")
    for r in per:
        assert len(r) == 2 and r[0][1] == r[1][1], r  # one connection per replica for the whole transaction
    assert per[0][0][1] != "rolled back" and per[1][0][1] != "rolled back"
    # inside the transactions: 2 x INSERT, 2 x SELECT, COMMIT; INSERT, ROLLBACK. BEGIN and START
    # TRANSACTION open them: answered by the middleware, each sent with its transaction's first
    # INSERT, so they are no write units of their own (9 if they were)
    assert stats["transaction_units"] == 7 and stats["writes"] == 7 and stats["disabled"] == []


def test_a_server_error_reaches_the_client_with_its_code(pair):
    _, dbs = pair
    fresh_table(dbs, "r_err", rows=1)
    stats: dict = {}
    with rust(pair, "rr", stats) as mw:
        code, _, err = client(mw, "INSERT INTO r_err (id, v) VALUES (1, 'dup')")
        assert code != 0 and "ERROR 1062 (23000)" in err and "Duplicate entry '1'" in err, err
        code, _, err = client(mw, "SELECT * FROM no_such_table")
        assert code != 0 and "ERROR 1146 (42S02)" in err, err
        code, out, err = client(mw, "SELECT v FROM r_err")  # the middleware goes on, nobody disabled
        assert code == 0 and out.split() == ["row1"], err
    assert [len(r) for r in rows(dbs, "r_err")] == [1, 1]
    assert stats["disabled"] == [] and stats["errors_to_clients"] == 2


def test_clients_without_the_lab_credentials_are_refused(pair):
    _, dbs = pair
    stats: dict = {}
    with rust(pair, "rr", stats) as mw:
        before = com_select(dbs)  # after the start's own reads (each backend's recovery position)
        for user, password in ((None, "wrong"), ("nobody", None), ("nobody", ""), (None, "")):
            code, out, err = client(mw, "SELECT 1", user=user, password=password)
            assert code != 0 and "ERROR 1045 (28000)" in err and out == "", (user, password, err)
        code, _, err = client(mw, "SELECT 1", database="elsewhere")
        assert code != 0 and "ERROR 1049" in err, err
        code, out, err = client(mw, "SELECT 1")  # the lab's user and password get in
        assert code == 0 and out.split() == ["1"], err
    assert sum(com_select(dbs)) - sum(before) == 1  # only the last one ran
    # (the start's readiness probe is a session too)
    assert stats["sessions"] >= 6 and stats["reads"] == 1 and stats["units"] == 1


def test_the_command_line_and_the_lab_wiring(tmp_path, monkeypatch):
    exe = str(engine_path())
    help_text = subprocess.run([exe, "middleware", "--help"], capture_output=True, text=True, check=True).stdout
    assert "--protocol <PROTOCOL>" in help_text and "mysql_native_password" in help_text
    out = subprocess.run(
        [
            exe,
            "middleware",
            "--protocol",
            "mysql",
            "--listen",
            "127.0.0.1:1",
            "--backend",
            "127.0.0.1:2",
            "--recovery-log",
            str(tmp_path / "r.log"),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "TIERSCOPE_MIDDLEWARE_PASSWORD": "pw"},
    )
    assert out.returncode != 0 and "PostgreSQL only" not in out.stderr  # taken (nobody at the backend)
    out = subprocess.run(
        [exe, "middleware", "--protocol", "oracle", "--listen", "127.0.0.1:1", "--backend", "h:2"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "oracle" in out.stderr

    from tierscope.services.middleware import Middleware
    from tierscope.spec import expand, spec_from_dict
    from tierscope.testbed.host import Host

    mw = Middleware(
        Host.loopback("m"),
        1,
        tmp_path / "mw",
        backends=["127.0.0.1:2", "127.0.0.1:3"],
        user="u",
        password="p",
        dbms="mariadb",
    )
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # the command itself, not wrapped for the lab's user
    argv = mw.command()
    assert argv[:2] == [exe, "middleware"] and argv[argv.index("--protocol") + 1] == "mysql"
    # replicas that cannot drift with MariaDB too: the log in the middleware's work directory
    assert argv[argv.index("--recovery-log") + 1] == str(tmp_path / "mw" / "middleware.recovery.log")
    raw = tomllib.loads((ROOT / "examples" / "specs" / "tiny.toml").read_text())
    raw["topology"] = "1/1/1/2M"
    raw.setdefault("soft", {})["middleware"] = {"implementation": "rust"}
    points = expand(spec_from_dict(raw, where="m", name="m"))  # accepted: the only middleware, with MariaDB
    assert points and points[0].config.dbms == "mariadb"
