"""The resource-aware read policy (`aware`): pure decisions worked out by hand, and the manager's
bookkeeping (labels, heavy reads in flight, the 50 ms series) driven without a network.

The real comparison with LPRF, RR, WRR and LRT on two CPU-limited PostgreSQL replicas is in
tests/test_middleware_heavy.py.
"""

from __future__ import annotations

import asyncio

import pytest

from tierscope.middleware import balance, sql
from tierscope.middleware.manager import Backend, RequestManager
from tierscope.middleware.pool import BackendPool

# --- pure ----------------------------------------------------------------------------------------


def test_labels_share_a_statement_with_different_literals():
    a = sql.label("SELECT abalance FROM pgbench_accounts WHERE aid = 1234; /*request_id='x'*/")
    b = sql.label("SELECT  abalance FROM pgbench_accounts\n WHERE aid = 77;")
    assert a == b == "SELECT abalance FROM pgbench_accounts WHERE aid = ?;"
    assert (
        sql.label("SELECT * FROM t WHERE s = 'it''s' AND x1 = 3.5e3 AND y = $1")
        == "SELECT * FROM t WHERE s = ? AND x1 = ? AND y = $1"
    )  # x1 keeps its digit, $1 stays
    assert sql.label("SELECT 1") != sql.label("SELECT 1 FROM big ORDER BY md5(x)")


@pytest.mark.parametrize(
    "expected, elapsed, remaining",
    [
        (0.100, 0.0, 0.100),
        (0.100, 0.060, 0.040),
        (0.100, 0.090, 0.025),  # never below a quarter of the average
        (0.100, 0.500, 0.025),
        (0.0, 0.1, 0.0),
    ],
)
def test_expected_remaining(expected, elapsed, remaining):
    assert balance.expected_remaining(expected, elapsed) == pytest.approx(remaining)


def test_expected_wait_sums_the_reads_in_flight_and_counts_writes_as_typical():
    now = 10.0
    # a heavy read (200 ms average) 50 ms in, and two light ones (1 ms) just started
    inflight = [(0.200, 9.950), (0.001, 10.0), (0.001, 10.0)]
    assert balance.expected_wait(inflight, now) == pytest.approx(0.150 + 0.002)
    assert balance.expected_wait(inflight, now, others=3, typical_s=0.001) == pytest.approx(0.155)
    assert balance.expected_wait([], now) == 0.0


@pytest.mark.parametrize(
    "waits, pending, enabled, chosen",
    [
        ([0.150, 0.002], [1, 2], [True, True], 1),  # LPRF would take 0 (fewer pending): a heavy runs there
        ([0.002, 0.150], [2, 1], [True, True], 0),
        ([0.0, 0.0], [0, 0], [True, True], 0),  # a tie goes to the earliest
        ([0.001, 0.001], [2, 1], [True, True], 1),  # equal waits: fewer pending
        ([0.0, 0.5], [0, 3], [False, True], 1),  # a disabled backend is skipped
        ([0.0], [0], [False], None),
    ],
)
def test_aware_choice(waits, pending, enabled, chosen):
    assert balance.choose_aware(waits, pending, enabled) == chosen


def test_aware_with_alike_requests_is_least_pending():
    # every read takes 1 ms and none finishes: the expected wait is 1 ms x pending
    pending, seq = [0, 0, 0], []
    for _ in range(6):
        i = balance.choose_aware([0.001 * n for n in pending], pending, [True] * 3)
        assert i == balance.choose_lprf(pending)
        seq.append(i)
        pending[i] += 1
    assert seq == [0, 1, 2, 0, 1, 2]


def test_weighted_median_and_heavy_labels():
    assert balance.weighted_median([5.0, 1.0, 3.0], [1, 1, 1]) == 3.0
    assert balance.weighted_median([1.0, 100.0], [95, 5]) == 1.0  # the typical execution, not the mean
    assert balance.weighted_median([1.0, 100.0], [1, 1]) == 1.0  # the lower median
    assert balance.weighted_median([1.0], [0]) is None
    service = {"light": 0.001, "medium": 0.004, "heavy": 0.120}
    counts = {"light": 950, "medium": 40, "heavy": 10}
    heavy, typical = balance.heavy_labels(service, counts)
    assert heavy == {"heavy"} and typical == 0.001
    # at sub-millisecond scale nothing is heavy (the floor: 5 ms)
    assert balance.heavy_labels({"a": 0.0001, "b": 0.003}, {"a": 10, "b": 1})[0] == set()
    assert balance.heavy_labels({}, {}) == (set(), None)


# --- the manager's bookkeeping (no network) ------------------------------------------------------


def manager(policy="aware") -> RequestManager:
    backends = [Backend(n, BackendPool(n, "127.0.0.1", 1, "u", "d", size=4)) for n in ("a", "b")]
    return RequestManager(backends, policy)


def test_manager_sends_light_reads_away_from_the_replica_running_a_heavy_one():
    async def go():
        m = manager()
        a, b = m.backends
        # teach it the labels: 95 light reads of 1 ms, 5 heavy reads of 100 ms
        for _ in range(95):
            m.read_done(a, 0.001, "light")
        for _ in range(5):
            m.read_done(b, 0.100, "heavy")
        m.update_heavy()
        assert m.heavy_set == {"heavy"} and m.typical_s == 0.001
        # a heavy read starts: the first backend (idle) gets it
        h = m.choose_read()
        th = m.read_begin(h, "heavy")
        assert h is a and a.heavy == 1 and a.pending == 1
        # two light reads: both to b although LPRF would put the second on a ([1,1] -> a)
        picks = []
        for _ in range(2):
            x = m.choose_read()
            m.read_begin(x, "light")
            picks.append(x.name)
        assert picks == ["b", "b"] and balance.choose_lprf([a.pending, b.pending - 1]) == 0
        # a second heavy read joins the first (it would wait there at most as long as it runs)
        h2 = m.choose_read("heavy")
        assert h2 is a
        m.read_begin(h2, "heavy")
        assert a.heavy == 2
        m.read_end(a, m._tokens)
        a.pending -= 1
        m.read_end(a, th)
        a.pending -= 1
        assert a.heavy == 0 and not a.inflight and a.heavy_reads == 2
        assert m.choose_read() is a  # idle again
        s = m.stats()
        assert s["labels"]["heavy"] == ["heavy"] and s["labels"]["typical_ms"] == 1.0
        assert [x["heavy_reads"] for x in s["backends"]] == [2, 0]

    asyncio.run(go())


def test_series_samples_pending_and_heavy_on_a_50ms_grid():
    async def go():
        m = manager("lprf")
        a, b = m.backends
        a.pending, b.heavy = 3, 1
        m.start_series(0.05)
        await asyncio.sleep(0.52)
        m.stop_series()
        n = len(m.series)
        await asyncio.sleep(0.12)
        assert len(m.series) == n  # stopped
        return m.series_stats(), n

    s, n = asyncio.run(go())
    assert 9 <= n <= 12  # samples at 0, 50, ..., 500 ms (a busy machine may skip a slot)
    assert s["interval_s"] == 0.05 and s["pending"] == {"a": [3] * n, "b": [0] * n}
    assert s["heavy"]["b"] == [1] * n and s["reads"]["a"] == [0] * n
    gaps = [y - x for x, y in zip(s["t_s"], s["t_s"][1:])]
    assert all(0.03 <= g <= 0.2 for g in gaps), gaps


@pytest.mark.parametrize(
    "waits, heavy, own, chosen",
    [
        ([0.080, 0.002], [1, 0], 0.150, 0),  # a heavy read joins the replica running one: waits 80 < 150 ms
        ([0.200, 0.002], [1, 0], 0.150, 1),  # but not to wait longer than it runs
        ([0.080, 0.002], [1, 0], None, 1),  # a light read goes to the smallest wait
        ([0.080, 0.060], [1, 2], 0.150, 1),  # the replica with the most heavy reads
        ([0.080, 0.080], [1, 1], 0.150, 0),  # ties: the smaller wait, then the earliest
        ([0.0, 0.0], [0, 0], 0.150, 0),  # nothing heavy anywhere: the rule for every read
    ],
)
def test_aware_keeps_heavy_reads_together(waits, heavy, own, chosen):
    assert balance.choose_aware(waits, [1, 1], [True, True], heavy, own) == chosen
    assert balance.choose_aware(waits, [1, 1], [False, True], heavy, own) in (1, None)


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
