"""Window arithmetic checked by hand on tiny tables (docs/analysis.md, "Windows")."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tierscope.analysis.windows import window_series, window_series_file, window_series_sql

MS = 1_000_000
W = 50 * MS
# an epoch-sized base that is a multiple of the window: 2026-11-22T00:00:00Z
BASE = 1_795_305_600_000_000_000


def table(rows, links=False):
    cols = {
        "tier": [r[0] for r in rows],
        "server": [r[1] for r in rows],
        "arrival_ns": pa.array([r[2] for r in rows], pa.int64()),
        "departure_ns": pa.array([r[3] for r in rows], pa.int64()),
    }
    if links:
        cols["request_id"] = [r[4] for r in rows]
        cols["parent_id"] = [r[5] for r in rows]
    return pa.table(cols)


def column(t: pa.Table, server: str, name: str) -> list:
    return [v for s, v in zip(t.column("server").to_pylist(), t.column(name).to_pylist()) if s == server]


def test_request_spanning_three_windows():
    # arrives 30 ms into window 0, leaves 20 ms into window 2: 20 + 50 + 20 ms
    t = window_series(table([("db", "db1", BASE + 30 * MS, BASE + 120 * MS)]), with_overlap=True)
    assert t.column("window_start_ns").to_pylist() == [BASE, BASE + W, BASE + 2 * W]
    assert column(t, "db1", "load") == pytest.approx([20 / 50, 1.0, 20 / 50])
    assert column(t, "db1", "load_max") == [1, 1, 1]
    assert column(t, "db1", "overlap") == [1, 1, 1]
    # one completion in window 2, per second: 1 / 0.05 s
    assert column(t, "db1", "throughput") == pytest.approx([0.0, 0.0, 20.0])


def test_boundaries_exactly_on_window_edges():
    rows = [
        ("db", "db1", BASE, BASE + W),  # exactly window 0, departs on the edge of window 1
        ("db", "db1", BASE + W, BASE + 2 * W),  # exactly window 1
        ("db", "db1", BASE + 2 * W, BASE + 2 * W),  # zero length on an edge
    ]
    t = window_series(table(rows), with_overlap=True)
    assert column(t, "db1", "load") == pytest.approx([1.0, 1.0, 0.0])
    # half-open intervals: never two at once, and a zero-length request is never "in" the server
    assert column(t, "db1", "load_max") == [1, 1, 0]
    assert column(t, "db1", "overlap") == [1, 1, 1]
    # departures at BASE+W and BASE+2W count in the window they open
    assert column(t, "db1", "throughput") == pytest.approx([0.0, 20.0, 40.0])


def test_two_servers_share_one_time_axis_and_max_is_instantaneous():
    rows = [
        ("app", "app1", BASE + 10 * MS, BASE + 20 * MS),
        ("app", "app1", BASE + 15 * MS, BASE + 25 * MS),  # overlaps the first for 5 ms
        ("app", "app1", BASE + 30 * MS, BASE + 40 * MS),
        ("db", "db1", BASE + 60 * MS, BASE + 70 * MS),
    ]
    t = window_series(table(rows))
    assert t.column("tier").to_pylist() == ["app", "app", "db", "db"]
    assert column(t, "app1", "load") == pytest.approx([30 / 50, 0.0])
    assert column(t, "app1", "load_max") == [2, 0]
    assert column(t, "db1", "load") == pytest.approx([0.0, 10 / 50])
    assert column(t, "db1", "throughput") == pytest.approx([0.0, 20.0])


def test_epoch_timestamps_stay_exact_where_float_division_fails():
    # 1 ns before a window edge at an epoch-sized time: float64 cannot even represent it
    edge = BASE + 1000 * W
    t_ns = edge - 1
    assert float(t_ns) == float(edge)  # the trap the integer arithmetic avoids
    t = window_series(table([("db", "db1", t_ns - 10 * MS, t_ns)]), base_ns=BASE)
    starts = t.column("window_start_ns").to_pylist()
    # the departure lands in window 999 (the one ending at `edge`), not in window 1000
    assert starts[-1] == edge - W
    assert column(t, "db1", "throughput")[-1] == pytest.approx(20.0)
    assert column(t, "db1", "load")[-1] == pytest.approx(10 / 50)


def test_default_base_is_the_first_arrival_floored_to_the_window():
    t = window_series(table([("db", "db1", BASE + 7 * W + 123, BASE + 7 * W + 5 * MS)]))
    assert t.column("window_start_ns").to_pylist() == [BASE + 7 * W]


def test_exclusive_load_subtracts_time_waiting_downstream():
    rows = [
        # app request 0–100 ms; its two db calls 10–30 and 60–70 ms (30 ms waiting downstream)
        ("app", "app1", BASE, BASE + 100 * MS, "a", None),
        ("db", "db1", BASE + 10 * MS, BASE + 30 * MS, "d1", "a"),
        ("db", "db1", BASE + 60 * MS, BASE + 70 * MS, "d2", "a"),
        # overlapping children of one parent count once (union): 110–140 and 120–150 → 40 ms
        ("app", "app1", BASE + 100 * MS, BASE + 150 * MS, "b", None),
        ("db", "db1", BASE + 110 * MS, BASE + 140 * MS, "d3", "b"),
        ("db", "db1", BASE + 120 * MS, BASE + 150 * MS, "d4", "b"),
        # a child whose parent was not observed is simply a db request
        ("db", "db1", BASE + 5 * MS, BASE + 15 * MS, "d5", "missing"),
    ]
    inc = window_series(table(rows, links=True))
    exc = window_series(table(rows, links=True), exclusive=True)
    # the last departure, at 150 ms, opens window 3 (where it is counted as a completion)
    assert column(inc, "app1", "load") == pytest.approx([1.0, 1.0, 1.0, 0.0])
    assert column(inc, "app1", "throughput") == pytest.approx([0.0, 0.0, 20.0, 20.0])
    # window 0 = [0, 50): a minus d1 (20 ms) → 30/50
    # window 1 = [50, 100): a minus d2 (10 ms) → 40/50
    # window 2 = [100, 150): b minus the union of d3 and d4 (110–150, 40 ms) → 10/50
    assert column(exc, "app1", "load") == pytest.approx([30 / 50, 40 / 50, 10 / 50, 0.0])
    assert column(exc, "app1", "load_max") == [1, 1, 1, 0]
    # the db's own load is the same inclusive or exclusive (no children)
    assert column(exc, "db1", "load") == pytest.approx(column(inc, "db1", "load"))


def test_normalised_throughput_weights_labels_by_median_service():
    rows = pa.table(
        {
            "tier": ["db"] * 4,
            "server": ["db1"] * 4,
            "label": ["fast", "fast", "slow", "slow"],
            "arrival_ns": pa.array([BASE, BASE + MS, BASE + 60 * MS, BASE + 61 * MS], pa.int64()),
            "departure_ns": pa.array([BASE + 2 * MS, BASE + 3 * MS, BASE + 90 * MS, BASE + 91 * MS], pa.int64()),
        }
    )
    t = window_series(rows, normalised=True)
    # medians: fast 2 ms, slow 30 ms, server 16 ms → weights 1/8 and 15/8
    assert column(t, "db1", "throughput") == pytest.approx([40.0, 40.0])
    assert column(t, "db1", "throughput_normalised") == pytest.approx([2 * (2 / 16) * 20, 2 * (30 / 16) * 20])


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="departure_ns < arrival_ns"):
        window_series(table([("db", "db1", BASE + 10, BASE)]))
    with pytest.raises(ValueError, match="'tier' is missing"):
        window_series(pa.table({"server": ["x"], "arrival_ns": [1], "departure_ns": [2]}))
    with pytest.raises(ValueError, match="window_ns must be a positive number"):
        window_series(table([("db", "db1", BASE, BASE + 1)]), window_ns=0)


def test_file_streaming_and_duckdb_sql_agree_with_the_table_version(tmp_path):
    rng = np.random.default_rng(3)
    n = 5000
    arrival = BASE + np.sort(rng.integers(0, 20 * W, n))
    departure = arrival + rng.integers(0, 3 * W, n)
    servers = np.array(["web1", "app1", "db1"])[rng.integers(0, 3, n)]
    t = pa.table(
        {
            "tier": [s[:-1] for s in servers],
            "server": servers,
            "arrival_ns": arrival,
            "departure_ns": departure,
        }
    )
    path = tmp_path / "requests.parquet"
    pq.write_table(t, path, row_group_size=700)
    ref = window_series(t, with_max=False)
    streamed = window_series_file(str(path), batch_rows=999)
    assert streamed.column("server").to_pylist() == ref.column("server").to_pylist()
    assert np.allclose(streamed.column("load").to_numpy(), ref.column("load").to_numpy())
    assert streamed.column("throughput").to_pylist() == ref.column("throughput").to_pylist()
    sql = window_series_sql(str(path))
    key = lambda tab: {  # noqa: E731
        (s, w): (lo, th)
        for s, w, lo, th in zip(
            *(tab.column(c).to_pylist() for c in ("server", "window_start_ns", "load", "throughput"))
        )
        if lo or th
    }
    a, b = key(sql), key(ref)
    assert a.keys() == b.keys()
    for k in a:
        assert a[k][0] == pytest.approx(b[k][0]) and a[k][1] == pytest.approx(b[k][1])


def test_parent_rows_never_links_a_missing_parent_to_a_missing_id():
    from tierscope.analysis.windows import parent_rows

    t = pa.table({"request_id": [None, "a", "b", None], "parent_id": [None, None, "a", "zz"]})
    assert parent_rows(t).tolist() == [-1, -1, 1, -1]
