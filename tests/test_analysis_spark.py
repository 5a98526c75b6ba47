"""The window SQL on Spark (local[2]) and on DuckDB: the same rows and values on a million requests,
equal to the numpy `window_series`, and to totals worked out from how the requests were made.

pyspark is in the `test` extra and Java 17 on the lab machines: these tests run in `make test`
(no skip). About 30 s, most of it the JVM and Spark starting.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tierscope.analysis import spark_windows
from tierscope.analysis.windows import (
    SQL_DIALECTS,
    SharedRequestIds,
    sql_query,
    window_series,
    window_series_sql,
)

MS = 1_000_000
W = 50 * MS
# an epoch-sized base that is a multiple of the window: 2026-11-22T00:00:00Z
BASE = 1_795_305_600_000_000_000
TRANSACTIONS = 250_000  # four rows each: web -> app -> two db calls
SPAN_MS = 60_000


def transactions(n: int = TRANSACTIONS, seed: int = 16) -> tuple[pa.Table, dict[str, dict[str, int]]]:
    """`n` web requests, each calling one app request that makes two db calls, on a 1 ms grid (so
    many times fall exactly on window edges), and the per-server totals the window series must
    add up to, computed here from the construction:

    * web w: [A, A+1) ms ... the app call [A+1, A+1+Da) ms, the web answers 1 ms after it, except
      5% that answer 1 ms *before* it (the child is clipped to its parent);
    * app: db call 1 at +1 ms for L1 ms; call 2 either after it (gap 0-2 ms, 0 = touching) or
      overlapping it (starting o < L1 ms later: a parallel call); the app answers 1 ms after the
      later one, except 5% that answer 2 ms before call 2 ends; L = 0 happens (empty calls);
    * 1% of db calls name a parent that is not in the table (ignored by exclusive load).

    Totals per server: `busy_ns` Σ(d − a), `own_ns` the same minus the union of the children's
    intervals clipped to each parent, `requests` the row count.
    """
    rng = np.random.default_rng(seed)
    i = np.arange(n)
    web_a = rng.integers(0, SPAN_MS, n) * MS
    app_a = web_a + MS
    l1 = rng.integers(0, 15, n) * MS
    l2 = rng.integers(0, 15, n) * MS
    parallel = rng.random(n) < 0.4
    gap = rng.integers(0, 3, n) * MS
    offset = (rng.random(n) * l1 // MS).astype(np.int64) * MS  # 0 <= offset < L1 (0 when L1 = 0)
    db1_a = app_a + MS
    db1_d = db1_a + l1
    db2_a = np.where(parallel, db1_a + offset, db1_d + gap)
    db2_d = db2_a + l2
    app_d = np.maximum(db1_d, db2_d) + MS
    early_app = rng.random(n) < 0.05
    app_d = np.where(early_app, np.maximum(db2_d - 2 * MS, app_a), app_d)
    web_d = app_d + MS
    early_web = rng.random(n) < 0.05
    web_d = np.where(early_web, np.maximum(app_d - 2 * MS, web_a), web_d)
    orphan1 = rng.random(n) < 0.01
    orphan2 = rng.random(n) < 0.01
    web_srv = np.where(i % 2 == 0, "web1", "web2")
    app_srv = np.where(rng.random(n) < 0.5, "app1", "app2")
    db1_srv = np.where(rng.random(n) < 0.5, "db1", "db2")
    db2_srv = np.where(rng.random(n) < 0.5, "db1", "db2")

    def ids(suffix: str) -> pa.Array:
        return pc.binary_join_element_wise(pa.array(i).cast(pa.string()), pa.scalar(suffix), "")

    web_id, app_id, db1_id, db2_id = ids("w"), ids("a"), ids("d1"), ids("d2")
    missing = ids("-not-seen")
    table = pa.table(
        {
            "tier": np.repeat(["web", "app", "db", "db"], n),
            "server": np.concatenate([web_srv, app_srv, db1_srv, db2_srv]),
            "request_id": pa.concat_arrays([web_id, app_id, db1_id, db2_id]),
            "parent_id": pa.concat_arrays(
                [
                    pa.nulls(n, pa.string()),
                    web_id,
                    pc.if_else(pa.array(orphan1), missing, app_id),
                    pc.if_else(pa.array(orphan2), missing, app_id),
                ]
            ),
            "arrival_ns": BASE + np.concatenate([web_a, app_a, db1_a, db2_a]),
            "departure_ns": BASE + np.concatenate([web_d, app_d, db1_d, db2_d]),
        }
    )

    def clip(a, d, pa_, pd_):  # interval clipped to its parent's: [max a, min d), length >= 0
        s, e = np.maximum(a, pa_), np.minimum(d, pd_)
        return s, np.maximum(e, s)

    s1, e1 = clip(db1_a, db1_d, app_a, app_d)
    s2, e2 = clip(db2_a, db2_d, app_a, app_d)
    len1 = np.where(orphan1, 0, e1 - s1)
    len2 = np.where(orphan2, 0, e2 - s2)
    both = np.maximum(np.minimum(e1, e2) - np.maximum(s1, s2), 0) * (~orphan1 & ~orphan2)
    app_wait = len1 + len2 - both  # |union of the two calls| (inclusion-exclusion)
    ws, we = clip(app_a, app_d, web_a, web_d)
    web_wait = we - ws
    totals: dict[str, dict[str, int]] = {}

    def add(servers, busy, own):
        for name in np.unique(servers):
            m = servers == name
            t = totals.setdefault(str(name), {"busy_ns": 0, "own_ns": 0, "requests": 0})
            t["busy_ns"] += int(busy[m].sum())
            t["own_ns"] += int(own[m].sum())
            t["requests"] += int(m.sum())

    add(web_srv, web_d - web_a, web_d - web_a - web_wait)
    add(app_srv, app_d - app_a, app_d - app_a - app_wait)
    add(db1_srv, db1_d - db1_a, db1_d - db1_a)
    add(db2_srv, db2_d - db2_a, db2_d - db2_a)
    return table, totals


@pytest.fixture(scope="module")
def requests_file(tmp_path_factory):
    table, totals = transactions()
    path = tmp_path_factory.mktemp("spark") / "requests.parquet"
    pq.write_table(table, path, row_group_size=1 << 18)
    return path, table, totals


@pytest.fixture(scope="module")
def spark_series(requests_file):
    path, _, _ = requests_file
    return spark_windows.window_series_spark([str(path)], W, exclusive=True)


def per_server(series: pa.Table, column: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for s, v in zip(series.column("server").to_pylist(), series.column(column).to_pylist()):
        out[s] = out.get(s, 0.0) + v
    return out


def test_the_data_exercise_what_they_claim(requests_file):
    _, table, totals = requests_file
    assert table.num_rows == 4 * TRANSACTIONS
    assert set(totals) == {"web1", "web2", "app1", "app2", "db1", "db2"}
    # exclusive load is a real subtraction at web and app, none at db
    for s in ("web1", "web2", "app1", "app2"):
        assert 0 < totals[s]["own_ns"] < totals[s]["busy_ns"]
    for s in ("db1", "db2"):
        assert totals[s]["own_ns"] == totals[s]["busy_ns"]
    since_base = table.column("departure_ns").to_numpy() - BASE
    assert (since_base % W == 0).sum() > 1000  # departures exactly on a window edge (half-open windows)


def test_spark_and_duckdb_give_the_same_rows_and_values(requests_file, spark_series):
    path, _, totals = requests_file
    duck = window_series_sql(str(path), W, exclusive=True)
    spark = spark_series
    assert spark.schema == duck.schema
    assert spark.column_names == ["tier", "server", "window_start_ns", "load", "load_exclusive", "throughput"]
    assert spark.num_rows == duck.num_rows > 6 * (SPAN_MS * MS // W)
    for name in ("tier", "server", "window_start_ns"):
        assert spark.column(name).equals(duck.column(name)), name
    for name in ("load", "load_exclusive", "throughput"):
        np.testing.assert_allclose(spark.column(name).to_numpy(), duck.column(name).to_numpy(), rtol=1e-9, atol=0)
    # ground truth from the construction: Σ load·W = busy time, Σ exclusive·W = own time,
    # Σ throughput·W/1e9 = requests, per server
    for got in (spark, duck):
        busy, own, done = per_server(got, "load"), per_server(got, "load_exclusive"), per_server(got, "throughput")
        for s, t in totals.items():
            assert busy[s] * W == pytest.approx(t["busy_ns"], rel=1e-12), s
            assert own[s] * W == pytest.approx(t["own_ns"], rel=1e-12), s
            assert round(done[s] * W / 1e9) == t["requests"], s


def test_sql_engines_equal_the_numpy_window_series(requests_file, spark_series):
    _, table, _ = requests_file
    dense = window_series(table, W, with_max=False)
    dense_excl = window_series(table, W, exclusive=True, with_max=False)
    key = list(zip(*(dense.column(c).to_pylist() for c in ("tier", "server", "window_start_ns"))))
    row_of = {k: i for i, k in enumerate(key)}
    got = spark_series
    rows = np.asarray(
        [row_of[k] for k in zip(*(got.column(c).to_pylist() for c in ("tier", "server", "window_start_ns")))]
    )
    for name, ref in (
        ("load", dense.column("load")),
        ("load_exclusive", dense_excl.column("load")),
        ("throughput", dense.column("throughput")),
    ):
        ref = ref.to_numpy()
        np.testing.assert_allclose(got.column(name).to_numpy(), ref[rows], rtol=1e-9, atol=0, err_msg=name)
        # the windows the SQL leaves out (no request touched them) are empty in the dense series
        absent = np.ones(ref.size, bool)
        absent[rows] = False
        assert not ref[absent].any(), name


def test_one_query_text_two_dialects():
    duck = sql_query("requests", W, BASE, exclusive=True, dialect="duckdb")
    spark = sql_query("requests", W, BASE, exclusive=True, dialect="spark")
    # the texts differ only in the generator that explodes a row into its windows
    diff = [(a, b) for a, b in zip(duck.splitlines(), spark.splitlines()) if a != b]
    assert len(duck.splitlines()) == len(spark.splitlines()) and len(diff) == 1
    assert "generate_series" in diff[0][0] and "sequence" in diff[0][1]
    assert set(SQL_DIALECTS) == {"duckdb", "spark"}
    with pytest.raises(ValueError, match="unknown SQL dialect"):
        sql_query("requests", W, BASE, dialect="postgres")


def test_shared_request_ids_are_refused_or_left_out(tmp_path):
    # a traced run: one id along the transaction; parent_id cannot name the parent row
    t = pa.table(
        {
            "tier": ["web", "app"],
            "server": ["web1", "app1"],
            "request_id": ["x", "x"],
            "parent_id": [None, "x"],
            "arrival_ns": [BASE, BASE + 10 * MS],
            "departure_ns": [BASE + 40 * MS, BASE + 30 * MS],
        }
    )
    path = tmp_path / "r.parquet"
    pq.write_table(t, path)
    with pytest.raises(SharedRequestIds, match="1 request ids are carried by more than one row"):
        window_series_sql(str(path), W, exclusive=True)
    out = window_series_sql(str(path), W, exclusive=True, shared_ids="ignore")
    assert out.column("load_exclusive").to_pylist() == out.column("load").to_pylist() == [0.4, 0.8]  # app1, web1


def test_missing_java_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("JAVA_HOME", "/nonexistent-jdk")
    with pytest.raises(spark_windows.EngineUnavailable, match=r"Java runtime.*JAVA_HOME"):
        spark_windows.check_spark()
    monkeypatch.delenv(spark_windows.MASTER_ENV, raising=False)
    assert spark_windows.resolve_master() == "local[2]"
    monkeypatch.setenv(spark_windows.MASTER_ENV, "spark://head:7077")
    assert spark_windows.resolve_master() == "spark://head:7077"
    assert spark_windows.resolve_master("local[1]") == "local[1]"


def test_cli_engines_write_the_same_window_series(tmp_path, spark_series):
    # spark_series first: its session is stopped; the CLI starts its own in the same JVM
    from typer.testing import CliRunner

    from tierscope.cli import app

    # web1 holds a request 0-40 ms that waits 10-30 ms on app1: exclusive 20 ms of 50
    t = pa.table(
        {
            "tier": ["web", "app"],
            "server": ["web1", "app1"],
            "request_id": ["w", "a"],
            "parent_id": [None, "w"],
            "arrival_ns": [BASE, BASE + 10 * MS],
            "departure_ns": [BASE + 40 * MS, BASE + 30 * MS],
        }
    )
    pq.write_table(t, tmp_path / "requests.parquet")
    runner = CliRunner()
    written = {}
    for engine, extra in (("duckdb", []), ("spark", ["--spark-master", "local[1]"])):
        out = tmp_path / engine
        res = runner.invoke(app, ["analyze", str(tmp_path), "--engine", engine, *extra, "-o", str(out)])
        assert res.exit_code == 0, res.output
        written[engine] = pq.read_table(out / "windows.parquet")
    assert written["spark"].equals(written["duckdb"])
    assert written["spark"].column("server").to_pylist() == ["app1", "web1"]
    assert written["spark"].column("load").to_pylist() == [0.4, 0.8]
    assert written["spark"].column("load_exclusive").to_pylist() == [0.4, 0.4]
    assert written["spark"].column("throughput").to_pylist() == [20.0, 20.0]
    res = runner.invoke(
        app,
        ["analyze", str(tmp_path), "--engine", "spark", "-o", str(tmp_path / "x")],
        env={"JAVA_HOME": "/nonexistent-jdk"},
    )
    assert res.exit_code == 2 and "Java runtime" in res.output
    res = runner.invoke(app, ["analyze", str(tmp_path), "--engine", "duckdb", "--report", "-o", str(tmp_path / "x")])
    assert res.exit_code == 2 and "--engine numpy" in res.output


def _one_request(directory):
    t = pa.table(
        {
            "tier": ["web"],
            "server": ["web1"],
            "request_id": ["w"],
            "parent_id": pa.nulls(1, pa.string()),
            "arrival_ns": [BASE],
            "departure_ns": [BASE + 40 * MS],
        }
    )
    pq.write_table(t, directory / "requests.parquet")
    return directory / "requests.parquet"


def test_a_master_that_cannot_work_is_one_line_before_spark_starts(tmp_path):
    """A malformed local master, or a standalone master nobody answers at, is refused in one line
    with exit status 2 before a JVM starts (Spark itself retries for a minute, then prints 300
    lines of Java and Python stack traces, exit 1)."""
    import socket
    import time

    from typer.testing import CliRunner

    from tierscope.cli import app
    from tierscope.services.base import free_port

    requests = _one_request(tmp_path)
    runner = CliRunner()
    nobody = f"spark://127.0.0.1:{free_port()}"
    for master, says in (
        ("local[x]", "local[x]: not a Spark master; use local[N]"),
        ("local[0]", "local[0]: not a Spark master"),
        (nobody, f"{nobody}: no Spark master answers (127.0.0.1:{nobody.rsplit(':', 1)[1]}: connection refused)"),
        ("spark://head", "spark://head: a standalone master is spark://HOST:PORT"),
    ):
        t0 = time.monotonic()
        res = runner.invoke(
            app, ["analyze", str(requests), "--engine", "spark", "--spark-master", master, "-o", str(tmp_path / "o")]
        )
        assert time.monotonic() - t0 < 15, master
        assert res.exit_code == 2, (master, res.output)
        lines = res.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: --spark-master {says}"), (master, res.output)
        assert "Traceback" not in res.output and "at org.apache" not in res.output
    for master in ("local", "local[2]", "local[*]", "local[2,3]", "local-cluster[2,1,1024]", "yarn", "k8s://h:443"):
        assert spark_windows.check_master(master) == master
    with socket.socket() as listener:  # a standalone master is someone listening at HOST:PORT
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        master = f"spark://127.0.0.1:{free_port()},127.0.0.1:{listener.getsockname()[1]}"
        assert spark_windows.check_master(master) == master


def test_a_master_spark_refuses_is_one_line_and_the_jvm_log_a_file(tmp_path):
    """A master that passes the check but that Spark refuses (spark-submit: "Master must either be
    yarn or start with spark, k8s, or local"): one line naming Spark's reason, exit 2; everything
    the JVM printed is in OUT/spark.log, nothing of it on the terminal."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    requests = _one_request(tmp_path)
    out = tmp_path / "o"
    tierscope = str(Path(sys.executable).parent / "tierscope")
    env = {k: v for k, v in os.environ.items() if k != spark_windows.MASTER_ENV}
    res = subprocess.run(
        [tierscope, "analyze", str(requests), "--engine", "spark", "--spark-master", "nonsense", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert res.returncode == 2, res.stderr
    assert res.stdout.strip() == f"window series of {requests} on spark (nonsense)"
    assert res.stderr.strip().splitlines() == [
        "error: --spark-master nonsense: Spark did not start: Master must either be yarn or start with spark, k8s, "
        f"or local (its log: {out / 'spark.log'})"
    ]
    assert "at org.apache.spark.deploy.SparkSubmit" in (out / "spark.log").read_text()
