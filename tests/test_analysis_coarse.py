"""Coarse-grain analyses on data whose answers are known by construction."""

import numpy as np
import pyarrow as pa
import pytest

from tierscope.analysis.blackbox import blackbox, knee_kneedle, load_curve
from tierscope.analysis.bottleneck_map import ConfigurationResult, bottleneck_map, throughput_groups
from tierscope.analysis.heavy import heavy_requests, heavy_summary, heavy_timeline
from tierscope.analysis.whitebox import density, density_peaks, whitebox
from tierscope.tiers import tier_of_host

S = 1_000_000_000

# A closed system (asymptotic bounds): demand D = 50 ms in total, bottleneck capacity X_max = 100/s,
# think time Z = 1 s. Then R(N) = max(D, N/X_max - Z) and X(N) = N / (R + Z); the knee is at
# N* = (D + Z) * X_max = 105 users.
D, XMAX, Z = 0.050, 100.0, 1.0
N_STAR = (D + Z) * XMAX


def _client_requests(users: int, seconds: float, rng) -> pa.Table:
    """Client requests of one level: throughput and response times from the response-time law."""
    r = max(D, users / XMAX - Z)
    x = users / (r + Z)
    n = int(round(x * seconds))
    start = np.sort(rng.uniform(0, seconds - 3 * r, n)) * S
    rt = rng.exponential(r, n) * 0.2 + 0.8 * r  # spread around r with the right mean
    start = start.astype(np.int64) + 10 * S
    return pa.table(
        {
            "user": np.zeros(n, np.int64),
            "session": np.zeros(n, np.int64),
            "state": ["Home"] * n,
            "start_ns": start,
            "end_ns": start + (rt * S).astype(np.int64),
            "status": pa.array([200] * n, pa.int32()),
            "error": pa.nulls(n, pa.string()),
            "phase": ["run"] * n,
        }
    )


def test_knee_from_response_time_law():
    rng = np.random.default_rng(1)
    levels = list(range(10, 310, 10))
    seconds = 60.0
    curve = load_curve([(u, _client_requests(u, seconds, rng), seconds) for u in levels])
    assert curve.column("users").to_pylist() == [float(u) for u in levels]
    bb = blackbox(curve, think_time_s=Z)
    # maximum throughput: the bottleneck's capacity, reached past the knee
    assert bb.max_throughput == pytest.approx(XMAX, rel=0.05)
    assert bb.max_throughput_users > N_STAR
    # the law at each level: X = N / (R + Z) (R = the measured mean), within sampling noise
    for row in curve.to_pylist():
        assert row["throughput"] == pytest.approx(row["users"] / (row["rt_mean"] + Z), rel=0.06)
    # kneedle on p90 lands on the measured level nearest N*; the bounds estimate on N* itself
    assert bb.knee.method == "kneedle"
    assert abs(bb.knee.users - N_STAR) <= 10
    assert bb.knee_bounds.users == pytest.approx(N_STAR, rel=0.08)


def test_kneedle_on_exact_hockey_stick_and_no_knee():
    users = np.arange(1, 41)
    rt = np.maximum(0.2, users * 0.05 - 0.8)  # bends at 20 users
    assert knee_kneedle(users, rt).users == 20
    assert knee_kneedle(users, np.full(40, 0.2)) is None  # flat: no knee
    assert knee_kneedle([1, 2], [0.1, 0.5]) is None


def _resources(host_values: dict[tuple[str, str], np.ndarray]) -> pa.Table:
    rows = {"ts_ns": [], "host": [], "metric": [], "value": [], "unit": []}
    for (host, metric), values in host_values.items():
        n = len(values)
        rows["ts_ns"] += [i * S for i in range(n)]
        rows["host"] += [host] * n
        rows["metric"] += [metric] * n
        rows["value"] += list(map(float, values))
        rows["unit"] += ["percent"] * n
    return pa.table(rows)


def test_bimodal_density_peaks_where_they_were_put():
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.normal(30, 3, 600), rng.normal(80, 2, 400)])
    d = density(x)
    peaks = density_peaks(d)
    assert len(peaks) == 2
    assert peaks[0] == pytest.approx(30, abs=1.5) and peaks[1] == pytest.approx(80, abs=1.5)
    # the taller peak is the one with more samples and the narrower spread
    assert np.trapezoid(d[(np.linspace(0, 100, 201) < 55)], dx=0.5) == pytest.approx(0.6, abs=0.03)


def test_pinned_resource_peaks_at_100_and_is_saturated():
    rng = np.random.default_rng(3)
    db_cpu = np.minimum(100, rng.normal(99, 1.5, 300))
    app_cpu = rng.normal(60, 10, 300)
    light = {("db1", "cpu"): rng.normal(40, 5, 300), ("app1", "cpu"): rng.normal(20, 5, 300)}
    heavy = {("db1", "cpu"): db_cpu, ("app1", "cpu"): app_cpu}
    wb = whitebox([(1000, _resources(light)), (4000, _resources(heavy))])
    assert wb.saturated[1000.0] == []
    assert wb.saturated[4000.0] == [("db1", "cpu")]
    shares = {(r["users"], r["host"]): r["share_above"] for r in wb.shares.to_pylist()}
    assert shares[(4000.0, "db1")] == pytest.approx(float(np.mean(db_cpu >= 95)))
    assert shares[(4000.0, "app1")] == pytest.approx(float(np.mean(app_cpu >= 95)))
    d = wb.density.filter(
        pa.compute.and_(pa.compute.equal(wb.density["users"], 4000.0), pa.compute.equal(wb.density["host"], "db1"))
    )
    assert density_peaks(d["density"].to_numpy())[-1] >= 98.5
    assert np.trapezoid(d["density"].to_numpy(), d["util"].to_numpy()) == pytest.approx(1.0, abs=1e-6)


def test_cpu_user_plus_system_is_derived():
    res = _resources({("app1", "cpu_user"): np.full(10, 70.0), ("app1", "cpu_system"): np.full(10, 28.0)})
    wb = whitebox([(10, res)])
    cpu = [r for r in wb.shares.to_pylist() if r["metric"] == "cpu"][0]
    assert cpu["mean"] == pytest.approx(98.0) and cpu["share_above"] == 1.0
    assert wb.saturated[10.0] == [("app1", "cpu")]


def test_bottleneck_map_groups_like_seed_000():
    # Seed 000 Fig. 3(a) in miniature: one DB -> ~300/s (db cpu); one app, more DBs -> ~600/s (app cpu);
    # two+ apps and DBs -> ~900/s (middleware cpu).
    results = [
        ConfigurationResult("1/1/1/1M", 300, {("db1", "cpu"): 0.9, ("app1", "cpu"): 0.2}),
        ConfigurationResult("1/2/1/1M", 310, {("db1", "cpu"): 0.95, ("app1", "cpu"): 0.1}),
        ConfigurationResult("1/1/1/2M", 600, {("app1", "cpu"): 0.8, ("db1", "cpu"): 0.3}),
        ConfigurationResult("1/1/1/3M", 620, {("app1", "cpu"): 0.85}),
        ConfigurationResult("1/2/1/2M", 900, {("mw1", "cpu"): 0.7, ("db1", "cpu"): 0.4}),
        ConfigurationResult("1/3/1/3M", 905, {("mw1", "cpu"): 0.75}),
        ConfigurationResult("1/3/1/4M", 910, {("mw1", "cpu"): 0.3, ("db2", "disk_util"): 0.2}),
    ]
    m = {r["config"]: r for r in bottleneck_map(results).to_pylist()}
    assert [m[c]["group"] for c in ("1/1/1/1M", "1/2/1/1M")] == [1, 1]
    assert [m[c]["group"] for c in ("1/1/1/2M", "1/1/1/3M")] == [2, 2]
    assert [m[c]["group"] for c in ("1/2/1/2M", "1/3/1/3M", "1/3/1/4M")] == [3, 3, 3]
    assert m["1/1/1/1M"]["bottleneck"] == "db CPU" and m["1/1/1/1M"]["bottleneck_metric"] == "db cpu"
    assert m["1/1/1/3M"]["bottleneck"] == "app CPU"
    assert m["1/2/1/2M"]["bottleneck"] == "middleware CPU"
    assert m["1/3/1/4M"]["bottleneck"] is None and m["1/3/1/4M"]["bottleneck_share"] == 0.3
    assert (m["1/3/1/4M"]["app"], m["1/3/1/4M"]["db"]) == (3, 4)
    assert throughput_groups({"a": 100, "b": 109, "c": 121}, 0.10) == {"a": 1, "b": 1, "c": 2}
    assert [tier_of_host(h) for h in ("db12", "mw1", "web", "app2", "cache1")] == [
        "db",
        "middleware",
        "web",
        "app",
        "cache",
    ]


def test_heavy_requests_found_with_counts_and_times():
    rng = np.random.default_rng(4)
    n = 2000
    arrival = np.sort(rng.integers(0, 60 * S, n))
    dur = rng.uniform(1e6, 3e6, n).astype(np.int64)  # 1-3 ms, median ~2 ms
    label = np.where(np.arange(n) % 2 == 0, "search", "view")
    heavy_idx = list(range(100, 1900, 150))  # make twelve "search" requests 500x slower
    assert all(label[i] == "search" for i in heavy_idx)
    for i in heavy_idx:
        dur[i] = 1_000_000_000  # 1 s
    dur[1] = 50_000_000  # a "view" request 25x slower: slow, and alone among the views
    t = pa.table(
        {
            "tier": ["db"] * n,
            "server": ["db1"] * n,
            "label": label,
            "arrival_ns": arrival,
            "departure_ns": arrival + dur,
        }
    )
    h = heavy_requests(t)
    assert sorted(h["arrival_ns"].to_pylist()) == sorted(int(arrival[i]) for i in heavy_idx)
    assert set(h["label"].to_pylist()) == {"search"}
    assert all(r >= 100 for r in h["ratio"].to_pylist())
    s = heavy_summary(t, h).to_pylist()
    assert len(s) == 1 and s[0]["heavy"] == len(heavy_idx) and s[0]["requests"] == n // 2
    assert s[0]["first_ns"] == min(int(arrival[i]) for i in heavy_idx)
    assert s[0]["max_ms"] == pytest.approx(1000.0)
    tl = heavy_timeline(h)
    assert sum(tl["heavy"].to_pylist()) == len(heavy_idx)
    # at 20x the slow view is slow too, but one of 13 slow requests for a label of half the
    # requests is what chance gives (a victim of something else), not a heavy kind of request
    assert len(heavy_requests(t, factor=20)) == len(heavy_idx)


def test_point_summary_counts_errors_apart_and_uses_the_run_phase():
    from tierscope.analysis.blackbox import point_summary

    t = pa.table(
        {
            "start_ns": pa.array([0, 0, 0, 0, 0], pa.int64()),
            "end_ns": pa.array([1 * S, 2 * S, 3 * S, 4 * S, 9 * S], pa.int64()),
            "status": pa.array([200, 503, 0, 200, 200], pa.int32()),
            "error": pa.array([None, "http5xx", "connect", None, None], pa.string()),
            "phase": ["run", "run", "run", "run", "ramp_down"],
        }
    )
    p = point_summary(10, t, seconds=4.0)
    assert (p["requests"], p["errors"]) == (2, 2)  # the ramp-down row is not counted at all
    assert p["throughput"] == 0.5 and p["rt_mean"] == pytest.approx(2.5)
