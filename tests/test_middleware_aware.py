"""The resource-aware read policy (`aware`) and the 50 ms series.

The pure decisions and the manager's bookkeeping are `cargo test` (engine/src/middleware), where
the cases the Python middleware had here went:
- labels: engine/tests/sql_cases.json's `label` cases (sql.rs labels_match_the_shared_cases; pytest
  through the running middleware: tests/test_middleware_sql_cases.py)
- the expected remaining service: balance.rs expected_remaining_never_falls_below_a_quarter_of_the_average
- the expected wait: balance.rs expected_wait_sums_the_reads_in_flight_and_counts_the_others_as_typical
- the choice: balance.rs aware_takes_the_least_expected_wait_then_fewer_pending_then_the_earliest,
  aware_with_alike_requests_is_least_pending, aware_scores_replicas_by_the_labels_they_run
- the typical time and the heavy labels: balance.rs weighted_median_and_heavy_labels
- the manager (light reads away from a heavy one, heavy reads together): mod.rs
  the_manager_sends_light_reads_away_from_the_replica_running_a_heavy_one,
  a_heavy_read_joins_heavy_reads_only_where_it_would_wait_at_most_its_own_time
End to end on two PostgreSQL servers: tests/test_middleware_rust.py (test_aware_*), and against
LPRF with heavy reads on CPU-limited replicas: tests/test_middleware_heavy.py. Here: the 50 ms
series of a running middleware, and the heavy-query case's pure helpers.
"""

from __future__ import annotations

import time

import test_middleware
from conftest import needs_postgres, needs_root
from test_middleware_rust import dsn, engine_built, rust_middleware  # noqa: F401  (engine_built: autouse)

servers = test_middleware.pair


@needs_root("PostgreSQL runs as its own OS user")
@needs_postgres
def test_series_samples_pending_on_a_50ms_grid(servers):
    """A read sleeping 0.6 s on the first backend (LPRF, one client): the series shows it pending
    there, and nothing on the second, in the samples of those 0.6 s, on a 50 ms grid."""
    import psycopg

    _, pgs = servers
    stats: dict = {}
    with (
        rust_middleware(servers, "lprf", stats=stats, extra=("--series-interval", "0.05")) as mw,
        psycopg.connect(dsn(mw), autocommit=True) as conn,
    ):
        time.sleep(0.3)
        t0 = time.monotonic()
        conn.execute("SELECT pg_sleep(0.6)")
        took = time.monotonic() - t0
        time.sleep(0.3)
    s = stats["series"]
    a, b = (p.address for p in pgs)
    assert s["interval_s"] == 0.05 and len(s["t_s"]) == len(s["pending"][a]) == len(s["reads"][a])
    gaps = [y - x for x, y in zip(s["t_s"], s["t_s"][1:], strict=False)]
    assert gaps and all(0.03 <= g <= 0.2 for g in gaps), gaps
    busy = s["pending"][a].count(1)
    assert 0.6 / 0.05 - 3 <= busy <= took / 0.05 + 2, (busy, took, s["pending"][a])
    assert set(s["pending"][a]) <= {0, 1} and set(s["pending"][b]) == {0}
    assert s["heavy"][a] == [0] * len(s["t_s"])  # lprf without --labels: nothing is heavy
    assert s["reads"][a][-1] == 1 and s["reads"][b][-1] == 0


# --- the heavy case's pure helpers ---------------------------------------------------------------


def test_percentile_is_nearest_rank():
    from tierscope.studies.heavy import percentile

    v = [float(x) for x in range(1, 11)]  # 1..10
    assert percentile(v, 0.9) == 9.0 and percentile(v, 0.5) == 5.0 and percentile(v, 1.0) == 10.0
    assert percentile([3.0], 0.99) == 3.0 and percentile(list(reversed(v)), 0.1) == 1.0


def test_pgbench_logs_are_read_per_transaction(tmp_path):
    from tierscope.studies.heavy import read_pgbench_logs

    # client_id transaction_no time(us) script_no time_epoch time_us, one file per pgbench thread
    (tmp_path / "light.123").write_text("0 0 450 0 1764100000 100\n0 1 10123 1 1764100000 20000\n")
    (tmp_path / "light.123.1").write_text("1 0 2000 0 1764100001 5\n")
    (tmp_path / "heavy.123").write_text("0 0 150000 0 1764100000 0\n")
    rows = read_pgbench_logs(tmp_path / "light")
    assert sorted((s, round(lat, 6)) for s, lat, _ in rows) == [(0, 0.00045), (0, 0.002), (1, 0.010123)]
    assert min(t for _, _, t in rows) == 1764100000.0001


def test_imbalance_summary_counts_light_reads_next_to_heavy_ones():
    from tierscope.studies.heavy import summary

    series = {"pending": {"a": [1, 3, 1, 0], "b": [2, 0, 1, 0]}, "heavy": {"a": [1, 1, 0, 0], "b": [0, 0, 1, 0]}}
    s = summary(series, ["a", "b"])
    # heavy somewhere in samples 0-2; a light read beside it in sample 1 (a: 3 pending, 1 heavy) only
    assert s["heavy_share"] == 0.75 and s["light_next_to_heavy_share"] == round(1 / 3, 3)
    assert s["uneven_share"] == 0.25 and s["mean_pending"] == [1.25, 0.75] and s["max_pending"] == [3, 2]
