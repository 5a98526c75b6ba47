"""Fine-grained analysis on simulated systems whose truth is known (queueing arithmetic + the
simulator's own record of when each server was saturated)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from tierscope.analysis.fine import analyze_fine
from tierscope.analysis.saturation import saturation_point
from tierscope.analysis.windows import interval_ratio, window_series
from tierscope.simulate import parse_spec, simulate


def one_tier(cores: int, service_ms: float, distribution: str, users: int, seed: int = 5):
    """A single server with `cores` CPUs; bursty users (MMPP, I = 200) so that its windows cover
    both sides of the knee: ~0.43 of capacity between surges, ~2.1x capacity in surges."""
    return parse_spec(
        {
            "seed": seed,
            "duration_s": 30,
            "warmup_s": 1,
            "workload": {"users": users, "think_time_s": 1.0, "index_of_dispersion": 200},
            "tier": [
                {
                    "name": "db",
                    "cores": cores,
                    "threads": 100_000,
                    "service_ms": service_ms,
                    "distribution": distribution,
                }
            ],
        }
    )


@pytest.mark.parametrize(
    "cores, distribution",
    [(1, "exponential"), (2, "exponential"), (4, "exponential"), (4, "deterministic"), (8, "exponential")],
)
def test_n_star_matches_queueing_theory(cores, distribution):
    # Asymptotic bounds of one station with k servers (Denning & Buzen): X <= L / S while the
    # load L is below k (nothing waits), X <= k / S once all k CPUs are busy; the two meet at
    # L = k. That is N*; TPmax = k / S. S = k x 0.5 ms, so TPmax = 2000/s for every k.
    service_s = cores * 0.0005
    sim = simulate(one_tier(cores, service_s * 1e3, distribution, users=1200))
    fg = analyze_fine(sim.requests, sim.events)
    ns = fg.n_star["db1"]
    assert ns.plateau_found, ns.method
    assert "found the server idle" in ns.method
    assert abs(ns.n_star - cores) <= 0.15 * cores, ns
    assert abs(ns.max_throughput - cores / service_s) <= 0.05 * cores / service_s, ns


@pytest.mark.parametrize("distribution", ["exponential", "deterministic"])
def test_n_star_from_windows_alone(distribution):
    """Without the requests (only load and throughput per window) the slope comes from the
    low-load windows; for four cores that is still within 15 % of k."""
    cores, service_s = 4, 0.002
    # Asymptotic bounds of one station with k servers (Denning & Buzen): X <= L / S while the
    # load L is below k (nothing waits), X <= k / S once all k CPUs are busy; the two meet at
    # L = k. That is N*; TPmax = k / S.
    expected_n_star = cores
    expected_tp_max = cores / service_s
    sim = simulate(one_tier(cores, service_s * 1e3, distribution, users=1200))
    s = window_series(sim.requests)
    ns = saturation_point(np.asarray(s["load"]), np.asarray(s["throughput"]))
    assert ns.plateau_found, ns.method
    assert abs(ns.n_star - expected_n_star) <= 0.15 * expected_n_star, ns
    assert abs(ns.max_throughput - expected_tp_max) <= 0.05 * expected_tp_max, ns


def test_no_plateau_when_the_server_never_saturates():
    # 300 users thinking 1 s on a server good for 2000/s: utilisation ~0.15, no knee to find
    sim = simulate(one_tier(4, 2.0, "exponential", users=300))
    s = window_series(sim.requests)
    ns = saturation_point(np.asarray(s["load"]), np.asarray(s["throughput"]))
    assert math.isinf(ns.n_star) and not ns.plateau_found
    assert "no plateau" in ns.method


def test_saturation_point_on_a_hand_made_main_sequence():
    # windows on X = min(L, 3) * 100 with ±5 % noise; the load drifts slowly (as a workload
    # does from window to window) between 0.2 and 12: the knee is at 3
    rng = np.random.default_rng(1)
    t = np.arange(800)
    load = 0.2 + 11.8 * (0.5 + 0.5 * np.sin(2 * np.pi * t / 200)) ** 2 * rng.normal(1, 0.03, t.size)
    thr = np.minimum(load, 3.0) * 100 * rng.normal(1, 0.05, load.size)
    ns = saturation_point(load, thr)
    assert ns.n_star == pytest.approx(3.0, rel=0.1)
    assert ns.max_throughput == pytest.approx(300, rel=0.05)
    few = saturation_point(load[:10], thr[:10])
    assert math.isinf(few.n_star) and "too few windows" in few.method


def three_tiers(users: int, app_freeze: bool, db_service_ms: float, index: float, seed: int = 11):
    app = {"name": "app", "cores": 2, "threads": 2000, "service_ms": 1.0}
    if app_freeze:
        # a stop-the-world pause of 250 ms every second (±20 %), like the JDK 1.5 GC of seed 001
        app["freeze"] = {"period_s": 1.0, "duration_s": 0.25}
    return parse_spec(
        {
            "seed": seed,
            "duration_s": 30,
            "warmup_s": 1,
            "workload": {"users": users, "think_time_s": 1.0, "index_of_dispersion": index},
            "tier": [
                {"name": "web", "cores": 2, "threads": 2000, "service_ms": 0.2},
                app,
                {"name": "db", "cores": 2, "threads": 2000, "service_ms": db_service_ms},
            ],
        }
    )


def precision_recall(fg, truth, tier: str) -> tuple[float, float, float]:
    """Window-level precision and recall of the tier's saturated windows against the truth:
    a window is truly saturated when the simulator recorded saturation for at least half of it."""
    rows = truth.filter(np.asarray(truth["tier"]) == tier)
    share = interval_ratio(
        np.asarray(rows["start_ns"]), np.asarray(rows["end_ns"]), fg.base_ns, fg.n_windows, fg.window_ns
    )
    true = share >= 0.5
    found = fg.tier_saturated()[tier]
    tp = float((true & found).sum())
    precision = tp / max(found.sum(), 1)
    recall = tp / max(true.sum(), 1)
    return precision, recall, float(true.mean())


@pytest.mark.parametrize("seed", [11, 2, 5])
def test_freezes_at_the_app_tier_make_an_alternating_bottleneck(seed):
    sim = simulate(three_tiers(600, app_freeze=True, db_service_ms=2.0, index=1, seed=seed))
    fg = analyze_fine(sim.requests, sim.events)
    assert fg.exclusive
    for tier in ("app", "db"):
        precision, recall, true_share = precision_recall(fg, sim.saturation_truth, tier)
        assert true_share > 0.15, f"the scenario must saturate {tier} for a while"
        assert precision >= 0.9 and recall >= 0.9, (tier, precision, recall)
    assert fg.verdict.kind == "alternating", fg.verdict
    assert fg.verdict.tiers == ["app", "db"]
    # in the seeds' words: the app paused (the simulator's events), the database saturated by the
    # burst of requests the app releases after each pause
    assert re.fullmatch(
        r"transient bottlenecks alternating between app \(paused \d+ times, median \d+ ms\) and db "
        r"\(saturated by the burst after each pause\)",
        fg.verdict.text,
    ), fg.verdict.text
    assert fg.verdict.confidence >= 0.8, fg.verdict
    # the pauses explain the app's load (seed 001 Fig. 6b)
    pauses = fg.pauses.to_pylist()
    assert [p["server"] for p in pauses] == ["app1"]
    assert pauses[0]["corr_load_vs_pause_ratio"] > 0.5
    assert pauses[0]["paused_share"] == pytest.approx(0.25, abs=0.05)
    # exclusive loads of app and db move against each other (seed 001 Fig. 6a)
    pair = [p for p in fg.pairs.to_pylist() if {p["tier_a"], p["tier_b"]} == {"app", "db"}][0]
    assert pair["corr_exclusive"] < 0
    assert fg.switches_per_s > 1.0  # about two switches per freeze cycle of one second
    # the web tier is never the bottleneck
    assert fg.saturated_share["web"] < 0.02
    # episodes tile the saturated windows
    eps = fg.episodes.filter(np.asarray(fg.episodes["tier"]) == "app")
    total = int(np.asarray(eps["duration_ns"]).sum())
    assert total == int(fg.tier_saturated()["app"].sum()) * fg.window_ns


@pytest.mark.parametrize("seed", [11, 3])
def test_one_slow_tier_is_named_as_the_single_bottleneck(seed):
    # db: 2 cores x 2.6 ms = 770/s; bursty users offer ~600/s on average, 2.1x that in surges
    sim = simulate(three_tiers(600, app_freeze=False, db_service_ms=2.6, index=200, seed=seed))
    fg = analyze_fine(sim.requests, sim.events)
    assert fg.verdict.kind == "single", fg.verdict
    assert fg.verdict.tiers == ["db"]
    assert fg.verdict.text == "single bottleneck at db"
    precision, recall, true_share = precision_recall(fg, sim.saturation_truth, "db")
    assert true_share > 0.15 and precision >= 0.9 and recall >= 0.9
    assert fg.n_star["db1"].max_throughput == pytest.approx(2 / 0.0026, rel=0.1)


def test_a_lightly_loaded_system_has_no_saturated_tier():
    sim = simulate(three_tiers(300, app_freeze=False, db_service_ms=2.0, index=1))
    fg = analyze_fine(sim.requests, sim.events)
    assert fg.verdict.kind == "none", fg.verdict
    assert fg.verdict.text == "no saturated tier"
    assert all(share == 0 for share in fg.saturated_share.values())


def test_series_columns_for_the_report():
    sim = simulate(three_tiers(200, app_freeze=True, db_service_ms=1.0, index=1))
    fg = analyze_fine(sim.requests, sim.events)
    names = set(fg.series.column_names)
    assert {
        "tier",
        "server",
        "window_start_ns",
        "load",
        "load_max",
        "throughput",
        "throughput_normalised",
        "load_exclusive",
        "pause_ratio",
        "saturated",
    } <= names
    assert fg.series.num_rows == 3 * fg.n_windows
    assert set(fg.n_star) == {"web1", "app1", "db1"}
    # requests: 3 tiers x completed client requests (each client request visits every tier once)
    assert fg.series.column("window_start_ns")[0].as_py() == fg.base_ns


def test_verdict_rules_on_hand_made_indicators():
    from tierscope.analysis.alternation import switches_per_second, verdict

    n = 200  # windows of 50 ms: 10 s
    app = np.zeros(n, bool)
    db = np.zeros(n, bool)
    app[0::10] = app[1::10] = True  # app saturated 2 windows in every 10
    db[5::10] = db[6::10] = db[7::10] = True  # db 3 in every 10, never with app
    sat = {"web": np.zeros(n, bool), "app": app, "db": db}
    tiers = ["web", "app", "db"]
    sw = switches_per_second(tiers, sat, 50_000_000)
    # the lone saturated tier changes app -> db -> app ... twice per 10 windows (0.5 s), minus the first
    assert sw == pytest.approx((2 * 20 - 1) / 10.0)
    v = verdict(tiers, sat, sw)
    assert (v.kind, v.tiers, v.text) == ("alternating", ["app", "db"], "bottleneck alternating between app and db")
    # the same shares, but db saturated whenever app is: several at once
    db2 = db | app
    v2 = verdict(tiers, {"web": sat["web"], "app": app, "db": db2}, 0.0)
    assert v2.kind == "several" and v2.tiers == ["app", "db"]
    # ... unless app calls db: then app's saturation is db's queue amplified upstream
    v3 = verdict(tiers, {"web": sat["web"], "app": app, "db": db2}, 0.0, calls={("web", "app"), ("app", "db")})
    assert (v3.kind, v3.tiers) == ("single", ["db"]) and "queue amplification" in v3.evidence
    # below 2 % of the windows nobody takes part
    tiny = np.zeros(n, bool)
    tiny[:3] = True
    assert verdict(tiers, {"web": tiny, "app": np.zeros(n, bool), "db": np.zeros(n, bool)}, 0.0).kind == "none"


def test_without_links_the_inclusive_load_decides_and_a_note_says_so():
    sim = simulate(three_tiers(300, app_freeze=False, db_service_ms=2.0, index=1))
    unlinked = sim.requests.drop_columns(["request_id", "parent_id"])
    fg = analyze_fine(unlinked)
    assert not fg.exclusive
    assert any("inclusive" in note for note in fg.notes)
    assert fg.series.column("load_exclusive").to_pylist() == fg.series.column("load").to_pylist()


def test_a_tier_near_the_bar_caps_the_verdict_unless_it_waited_on_its_callee():
    from tierscope.analysis.alternation import NEAR_CAP, verdict

    n = 200
    db = np.zeros(n, bool)
    db[0::4] = True  # db saturated a quarter of the windows (25 %)
    app = np.zeros(n, bool)
    app[0:150:40] = True  # app 4 windows (2 %): just under the bar, near it
    tiers = ["app", "db"]
    off = np.zeros(n, bool)
    # app's 4 windows inside db's saturated ones, but app does not call db: near the bar, at most NEAR_CAP
    v = verdict(tiers, {"app": app, "db": db}, 0.0, min_share=0.03)
    assert (v.kind, v.tiers) == ("single", ["db"]) and v.confidence <= NEAR_CAP and "near the" in v.evidence, v
    # app calls db and was saturated only while db was: its queue waited on db (rule 2), not near the bar
    v2 = verdict(tiers, {"app": app, "db": db}, 0.0, min_share=0.03, calls={("app", "db")})
    assert (v2.kind, v2.tiers) == ("single", ["db"]) and "near the" not in v2.evidence, v2
    assert v2.confidence > NEAR_CAP, v2
    # app calls db but was saturated away from db's windows: it stays near the bar
    app_away = np.zeros(n, bool)
    app_away[1:150:40] = True
    v3 = verdict(tiers, {"app": app_away, "db": db}, 0.0, min_share=0.03, calls={("app", "db")})
    assert "near the" in v3.evidence and v3.confidence <= NEAR_CAP, v3
    assert verdict(tiers, {"app": off, "db": db}, 0.0, min_share=0.03).confidence > NEAR_CAP
