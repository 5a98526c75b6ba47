"""The database drivers (`tierscope-engine ycsb|tpcc`, `tierscope oltp`) against real PostgreSQL
and MariaDB servers. Ground truth: the rows in the database (counted with psql / SQL), the
servers' own counters (pg_stat_user_tables, Handler_update), the population rules and
hand-computed hashes. The generators' arithmetic (Zipf, NURand, the deck) is tested in the
engine's own unit tests (engine/src/oltp)."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import time

import pytest
from typer.testing import CliRunner

from conftest import needs_postgres, needs_root
from tierscope.engine import engine_path
from tierscope.oltp import OltpError, run_engine, started_database, tpcc_load, tpcc_run, ycsb_load, ycsb_run

needs_mariadb = pytest.mark.skipif(not os.path.exists("/usr/sbin/mariadbd"), reason="mariadb-server not installed")
pytestmark = [needs_root("servers run as their own OS users"), needs_postgres]


def fnv64(val: int) -> int:
    """YCSB's Utils.fnvhash64, by hand: FNV-1a over the 8 little-end bytes, as abs(Java long)."""
    h = 0xCBF29CE484222325
    for _ in range(8):
        h ^= val & 0xFF
        val >>= 8
        h = (h * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    signed = h - (1 << 64) if h >= 1 << 63 else h
    return abs(signed)


def within_binomial(k: int, n: int, p: float, sds: float = 5.0) -> bool:
    return abs(k - n * p) <= sds * math.sqrt(n * p * (1 - p)) + 1


@pytest.fixture(scope="module")
def pg(tmp_path_factory):
    with started_database("postgresql", tmp_path_factory.mktemp("pg")) as (svc, dsn):
        yield svc, dsn


@pytest.fixture(scope="module")
def maria(tmp_path_factory):
    if not os.path.exists("/usr/sbin/mariadbd"):
        pytest.skip("mariadb-server not installed")
    with started_database("mariadb", tmp_path_factory.mktemp("maria")) as (svc, dsn):
        yield svc, dsn


def psql(dsn: str, sql: str) -> list[str]:
    out = subprocess.run(["psql", dsn, "-Atc", sql], capture_output=True, text=True, check=True, timeout=60)
    return out.stdout.split()


# ---- YCSB --------------------------------------------------------------------------------------


def test_ycsb_load_writes_the_hashed_keys_and_field_sizes(pg):
    svc, dsn = pg
    s = ycsb_load(dsn, records=10_000, field_length=100)
    assert s["records"] == 10_000
    assert psql(dsn, "select count(*) from usertable") == ["10000"]
    keys = set(psql(dsn, "select ycsb_key from usertable"))
    assert keys == {f"user{fnv64(i)}" for i in range(10_000)}
    assert psql(dsn, "select min(length(field0)), max(length(field9)) from usertable")[0] == "100|100"


def test_ycsb_a_updates_equal_postgres_own_count_and_mix_is_half_half(pg):
    svc, dsn = pg
    ycsb_load(dsn, records=10_000)
    svc.sql("select pg_stat_reset()", "bench", admin=True)  # the superuser's, over the socket
    s = ycsb_run(dsn, workload="a", threads=4, duration=20, ops=6000)
    assert s["errors"] == 0 and s["ops"] == 6000 and s["stopped_by"] == "ops"
    upd, rd = s["operations"]["UPDATE"]["count"], s["operations"]["READ"]["count"]
    assert upd + rd == 6000
    assert within_binomial(upd, 6000, 0.5), upd
    # the server's count of updated rows (flushed when the engine's sessions end)
    deadline = time.monotonic() + 10
    while True:
        n = int(
            psql(
                dsn,
                "select pg_stat_clear_snapshot(); select n_tup_upd from pg_stat_user_tables "
                "where relname = 'usertable'",
            )[-1]
        )
        if n == upd or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert n == upd
    for op in ("READ", "UPDATE"):
        o = s["operations"][op]
        assert 0 < o["p50_us"] <= o["p90_us"] <= o["p99_us"] <= o["max_us"]


def usertable_scans(dsn: str) -> tuple[int, int]:
    """PostgreSQL's own count of index scans on usertable and the rows they fetched."""
    scans, fetched = psql(
        dsn,
        "select pg_stat_clear_snapshot(); select idx_scan || ' ' || idx_tup_fetch from pg_stat_user_tables "
        "where relname = 'usertable'",
    )[-2:]
    return int(scans), int(fetched)


def test_ycsb_c_reads_equal_postgres_own_index_scans(pg):
    """The reads bench/oltp counts per CPU-second (through the engine's own client, pgwire) are
    reads the server did: one primary-key index scan fetching one row each, no more, no fewer."""
    svc, dsn = pg
    ycsb_load(dsn, records=10_000)
    before = usertable_scans(dsn)
    # --records given: the engine does not count the table first (that would scan it once more)
    s = ycsb_run(dsn, workload="c", threads=4, duration=60, ops=20_000, records=10_000)
    assert s["errors"] == 0 and s["ops"] == 20_000 and s["stopped_by"] == "ops"
    assert s["operations"]["READ"]["count"] == 20_000
    deadline = time.monotonic() + 10  # a backend flushes its counters when its session ends
    while True:
        scans, fetched = (a - b for a, b in zip(usertable_scans(dsn), before))
        if scans >= 20_000 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert (scans, fetched) == (20_000, 20_000)


def test_ycsb_d_inserts_grow_the_table_by_the_reported_count(pg):
    svc, dsn = pg
    ycsb_load(dsn, records=10_000)
    s = ycsb_run(dsn, workload="d", threads=2, duration=20, ops=3000)
    ins = s["operations"]["INSERT"]["count"]
    assert s["errors"] == 0 and within_binomial(ins, 3000, 0.05)
    assert psql(dsn, "select count(*) from usertable") == [str(10_000 + ins)]


def test_ycsb_target_paces_the_offered_load_and_measures_from_intended_start(pg, tmp_path):
    svc, dsn = pg
    ycsb_load(dsn, records=10_000)
    log = tmp_path / "ops.parquet"
    s = ycsb_run(dsn, workload="c", threads=2, duration=2.0, target=500, log=log)
    assert s["latency_from"] == "intended"
    # 2 threads × 1 op every 4 ms for 2 s, each starting at a random offset within its first interval
    assert 990 <= s["ops"] <= 1001, s["ops"]
    import pyarrow.parquet as pq

    t = pq.read_table(log).to_pydict()
    assert len(t["op"]) == s["ops"] == s["log"]["rows"]
    assert set(t["op"]) == {"READ"}
    assert all(i <= st <= e for i, st, e in zip(t["intended_ns"], t["start_ns"], t["end_ns"]))
    assert all(lat == (e - i) // 1000 for lat, e, i in zip(t["latency_us"], t["end_ns"], t["intended_ns"]))


@needs_mariadb
def test_ycsb_on_mariadb_updates_equal_the_handler_count(maria):
    svc, dsn = maria
    s = ycsb_load(dsn, records=10_000)
    assert svc.sql("select count(*) from bench.usertable")[0][0] == 10_000
    before = int(svc.sql("show global status like 'Handler_update'")[0][1])
    s = ycsb_run(dsn, workload="a", threads=4, duration=20, ops=4000)
    after = int(svc.sql("show global status like 'Handler_update'")[0][1])
    assert s["errors"] == 0 and s["ops"] == 4000
    assert after - before == s["operations"]["UPDATE"]["count"]


def test_ycsb_missing_table_is_a_clear_error(pg):
    svc, dsn = pg
    svc.create_database("empty_y")
    with pytest.raises(OltpError) as err:
        ycsb_run(dsn.replace("dbname=bench", "dbname=empty_y"), duration=1)
    assert err.value.code == 2 and "usertable is missing" in str(err.value)


# ---- TPC-C -------------------------------------------------------------------------------------

POPULATION_1W = {
    "warehouse": 1,
    "district": 10,
    "customer": 30_000,
    "history": 30_000,
    "orders": 30_000,
    "new_order": 9_000,
    "item": 100_000,
    "stock": 100_000,
}


@pytest.fixture(scope="module")
def pg_tpcc(pg):
    svc, dsn = pg
    svc.create_database("tpcc")
    tdsn = dsn.replace("dbname=bench", "dbname=tpcc")
    loaded = tpcc_load(tdsn, warehouses=1)
    return tdsn, loaded


def test_tpcc_load_follows_the_population_rules(pg_tpcc):
    dsn, loaded = pg_tpcc
    for table, n in POPULATION_1W.items():
        assert psql(dsn, f"select count(*) from {table}") == [str(n)], table
        assert loaded["rows"][table] == n
    lines, cnt = map(
        int, psql(dsn, "select (select count(*) from order_line), (select sum(o_ol_cnt) from orders)")[0].split("|")
    )
    assert lines == cnt == loaded["rows"]["order_line"]
    assert 5 * 30_000 <= lines <= 15 * 30_000 and abs(lines / 30_000 - 10) < 0.1
    # undelivered orders: 2101..3000 of each district, no carrier, in new_order
    assert psql(dsn, "select count(*) from orders where o_carrier_id is null") == ["9000"]
    assert psql(dsn, "select min(no_o_id), max(no_o_id) from new_order")[0] == "2101|3000"
    assert psql(dsn, "select d_next_o_id from district group by d_next_o_id") == ["3001"]
    bc = int(psql(dsn, "select count(*) from customer where c_credit = 'BC'")[0])
    assert within_binomial(bc, 30_000, 0.10)
    orig = int(psql(dsn, "select count(*) from item where i_data like '%ORIGINAL%'")[0])
    assert within_binomial(orig, 100_000, 0.10)
    # customers 1..1000 of a district carry the last name of c_id - 1 (syllables by digit)
    syl = ["BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING"]
    names = psql(dsn, "select c_last from customer where c_w_id = 1 and c_d_id = 3 and c_id <= 1000 order by c_id")
    assert names == [syl[n // 100] + syl[n // 10 % 10] + syl[n % 10] for n in range(1000)]


def test_tpcc_run_counts_equal_the_rows_it_wrote(pg_tpcc):
    dsn, _ = pg_tpcc
    q = (
        "select (select count(*) from orders), (select count(*) from history), (select count(*) from new_order), "
        "(select sum(d_next_o_id - 3001) from district)"
    )
    o0, h0, n0, d0 = map(int, psql(dsn, q)[0].split("|"))
    s = tpcc_run(dsn, duration=5, no_waits=True)
    o1, h1, n1, d1 = map(int, psql(dsn, q)[0].split("|"))
    tx = s["transactions"]
    assert s["errors"] == 0 and s["waits"] is False and s["tpcc_like"] is True
    committed = s["new_orders"]["committed"]
    assert committed + s["new_orders"]["rolled_back"] == tx["NEW_ORDER"]["count"]
    assert o1 - o0 == committed == d1 - d0
    assert h1 - h0 == tx["PAYMENT"]["count"]
    assert n0 + committed - n1 == s["delivered_orders"]
    assert s["delivered_orders"] == 10 * tx["DELIVERY"]["count"] - s["delivery_skipped_districts"]
    # tpmC = New-Orders per minute of the measured interval
    assert s["tpmC"] == pytest.approx(tx["NEW_ORDER"]["count"] / (s["seconds"] / 60), rel=0.01)
    # the deck: each terminal's shares are exact per 100 cards, so the totals sit within binomial bounds
    n = s["transactions_done"]
    for name, p in (
        ("NEW_ORDER", 0.45),
        ("PAYMENT", 0.43),
        ("ORDER_STATUS", 0.04),
        ("DELIVERY", 0.04),
        ("STOCK_LEVEL", 0.04),
    ):
        assert within_binomial(tx[name]["count"], n, p, 4), (name, tx[name]["count"], n)
        assert tx[name]["p90_rule"] == "passed"
    assert s["p90_rules_passed"] is True
    assert s["new_orders"]["remote_order_lines"] == 0  # one warehouse: nothing is remote


def test_tpcc_with_scaled_waits_gives_the_closed_loop_tpmc(pg_tpcc):
    """With keying and think times scaled by s, a warehouse's 10 terminals give at most
    12.86 / s tpmC (cycle 20.99 s × s per transaction, 45 % New-Orders); the response times, a
    few ms against a 420 ms cycle, lower it slightly."""
    dsn, _ = pg_tpcc
    scale = 0.02
    s = tpcc_run(dsn, duration=8, wait_scale=scale)
    assert s["waits"] is True and s["tpcc_like"] is True and s["errors"] == 0
    expected = 10 * 60 / (20.99 * scale) * 0.45
    assert 0.7 * expected <= s["tpmC"] <= 1.15 * expected, (s["tpmC"], expected)


@pytest.fixture(scope="module")
def pg_tpcc_2w(pg):
    svc, dsn = pg
    svc.create_database("tpcc2")
    tdsn = dsn.replace("dbname=bench", "dbname=tpcc2")
    tpcc_load(tdsn, warehouses=2)
    return tdsn


def test_tpcc_drivers_with_terminal_offsets_take_their_own_warehouses(pg_tpcc_2w):
    """Two driver processes of one terminal each on two warehouses: with offsets 0 and 1 each
    terminal has its own home warehouse, so each process's committed New-Orders advance its
    warehouse's districts (New-Order picks its district at random in the home warehouse)."""
    import concurrent.futures

    dsn = pg_tpcc_2w
    q = "select d_w_id, sum(d_next_o_id) from district group by d_w_id order by d_w_id"

    def next_ids() -> dict[int, int]:
        return {int(w): int(n) for w, n in (row.split("|") for row in psql(dsn, q))}

    before = next_ids()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = [
            pool.submit(tpcc_run, dsn, duration=3, terminals=1, terminal_offset=offset, no_waits=True, seed=offset + 1)
            for offset in (0, 1)
        ]
        summaries = [f.result() for f in runs]
    after = next_ids()
    assert [s["terminal_offset"] for s in summaries] == [0, 1]
    committed = [s["new_orders"]["committed"] for s in summaries]
    assert min(committed) > 0
    assert [after[w] - before[w] for w in (1, 2)] == committed


def test_tpcc_missing_tables_names_them_and_exits_2(pg):
    svc, dsn = pg
    svc.create_database("half")
    hdsn = dsn.replace("dbname=bench", "dbname=half")
    psql(hdsn, "create table warehouse (w_id int); create table item (i_id int)")
    r = subprocess.run(
        [str(engine_path()), "tpcc", "run", "--dsn", hdsn, "--duration", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert "district, customer, history, orders, new_order, order_line, stock" in r.stderr
    assert "warehouse" not in r.stderr.split("missing:")[1].split("(")[0]


@needs_mariadb
def test_tpcc_on_mariadb_two_warehouses_remote_work_equals_rows(maria):
    """W = 2: 1 % of order lines come from the other warehouse and 15 % of payments are for a
    customer of the other warehouse; the driver's counts of both equal what the rows say."""
    svc, dsn = maria
    loaded = tpcc_load(dsn, warehouses=2)
    assert loaded["rows"]["stock"] == 200_000 and loaded["rows"]["item"] == 100_000
    assert svc.sql("select count(*) from bench.customer")[0][0] == 60_000
    q = (
        "select (select count(*) from bench.orders), (select count(*) from bench.history where h_w_id <> h_c_w_id), "
        "(select sum(s_remote_cnt) from bench.stock)"
    )
    o0, h0, r0 = (int(x) for x in svc.sql(q)[0])
    s = tpcc_run(dsn, duration=5, no_waits=True)
    o1, h1, r1 = (int(x) for x in svc.sql(q)[0])
    assert s["dbms"] == "mariadb" and s["warehouses"] == 2 and s["terminals"] == 20
    assert s["errors"] <= 0.01 * s["transactions_done"], s["errors"]
    no = s["new_orders"]
    assert o1 - o0 == no["committed"] > 0
    assert h1 - h0 == s["payments_remote"]
    assert r1 - r0 == no["remote_order_lines"]
    assert within_binomial(s["payments_remote"], s["transactions"]["PAYMENT"]["count"], 0.15)
    assert within_binomial(no["remote_order_lines"], no["order_lines"], 0.01)


# ---- CLI ---------------------------------------------------------------------------------------


def test_cli_help_teaches():
    from tierscope.cli import app

    r = CliRunner().invoke(app, ["oltp", "--help"])
    assert r.exit_code == 0 and "YCSB" in r.output and "TPC-C" in r.output and "--dsn" in r.output
    r = CliRunner().invoke(app, ["oltp", "ycsb", "--help"])
    assert r.exit_code == 0
    for word in ("--workload", "read-modify-write", "--target", "coordinated", "--dsn"):
        assert word in r.output, word
    r = CliRunner().invoke(app, ["oltp", "tpcc", "--help"])
    assert r.exit_code == 0 and "--no-waits" in r.output and "12.86" in r.output


def test_cli_starts_a_server_runs_and_leaves_nothing(tmp_path):
    from tierscope.cli import app

    r = CliRunner().invoke(
        app,
        [
            "oltp",
            "ycsb",
            "--dbms",
            "postgresql",
            "--workdir",
            str(tmp_path),
            "--records",
            "2000",
            "--duration",
            "1",
            "--threads",
            "2",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.output.splitlines() if ln.startswith("{")]
    assert '"phase": "load"' in lines[0] and '"records": 2000' in lines[0]
    assert '"phase": "run"' in lines[1]
    # the server is gone: nothing holds its data directory
    data = str(tmp_path / "postgresql" / "data")
    left = subprocess.run(["pgrep", "-f", data], capture_output=True, text=True).stdout.strip()
    assert left == ""


def test_cli_refuses_an_unknown_workload_before_loading(pg, tmp_path):
    """`oltp ycsb --workload z` (or a key distribution the engine does not know) is refused by
    the CLI in one line listing the valid ones, exit 2, before the table is touched: the engine
    would refuse it only after (re)loading the data, in its own words."""
    from tierscope.cli import app

    svc, dsn = pg
    svc.create_database("untouched")
    udsn = dsn.replace("dbname=bench", "dbname=untouched")
    ycsb_load(udsn, records=100, field_length=10)
    for option, value, said in (
        ("--workload", "z", "--workload z: not a YCSB core workload; one of a (50 % read / 50 % update), b "),
        ("--distribution", "gauss", "--distribution gauss: one of zipfian, latest, uniform"),
    ):
        t0 = time.monotonic()
        r = CliRunner().invoke(app, ["oltp", "ycsb", "--dsn", udsn, "--records", "500", option, value])
        assert r.exit_code == 2, r.output
        assert r.output.strip().startswith(f"error: {said}") and len(r.output.strip().splitlines()) == 1, r.output
        assert "f (50 % read / 50 % read-modify-write)" in r.output or option != "--workload"
        assert time.monotonic() - t0 < 5
        # not reloaded with 500 records: the 100 rows are the ones loaded above
        assert psql(udsn, "select count(*) from usertable") == ["100"]
    with pytest.raises(ValueError, match="--workload g: not a YCSB core workload"):
        ycsb_run(udsn, workload="g", duration=1)
    assert ycsb_run(udsn, workload="C", duration=0.5, threads=1)["workload"] == "c"


def test_engine_is_the_installed_one():
    assert shutil.which(str(engine_path())) or engine_path().exists()
    with pytest.raises(OltpError) as err:
        run_engine(["ycsb", "run", "--dsn", "host=127.0.0.1 port=1 user=x dbname=x", "--duration", "1"], 30)
    assert err.value.code == 2 and "connecting to PostgreSQL" in str(err.value)
