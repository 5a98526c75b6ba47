"""The verdict on systems tierscope did not build (issue 11): N-tier systems simulated by an
independent SimPy model (`independent_sim`: FCFS cores, thread and connection pools, freezes),
exported as OTLP/JSON, imported and analysed as `tierscope analyze` does. The truth of every
case is known by construction: which server's cores had a queue or which server was frozen while
holding requests, window by window (`independent_sim.truth_shares`), and the verdict that follows
from the configuration the test chose.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow.compute as pc
import pytest

from independent_sim import (
    Page,
    Server,
    System,
    freeze_events,
    periodic,
    simulate,
    truth_shares,
    write_otlp,
)  # simpy, the test extra
from tierscope.analysis.experiment import analyze_files, run_fine  # noqa: E402

DURATION_S = 24.0
WARMUP_S = 4.0


def analysed(system: System, tmp_path, events: bool = False, duration_s: float = DURATION_S):
    """Simulate, export OTLP, import and analyse; returns (fine, truth shares per tier)."""
    result = simulate(system, duration_s, WARMUP_S)
    path = write_otlp(result.spans, tmp_path / "spans.json")
    data = analyze_files([path])
    fine = data.fine
    if events:
        fine, _ = run_fine(data.requests, freeze_events(system, WARMUP_S, duration_s), data.window_ns)
    return fine, truth_shares(result, system), data


def shop(
    db_cores=1,
    db_s=0.004,
    users=400,
    app_cores=4,
    app_servers=1,
    app_s=0.001,
    connections=1000,
    freezes=(),
    tiers=("frontend", "app", "postgres"),
    seed=1,
) -> System:
    fe, app, db = tiers
    servers = [Server(fe, "fe1", cores=8)]
    servers += [
        Server(app, f"app{i + 1}", cores=app_cores, threads=1000, connections=connections, freezes=list(freezes))
        for i in range(app_servers)
    ]
    servers += [Server(db, "db1", cores=db_cores)]
    pages = [
        Page("ViewItem", 3, {fe: 0.0002, app: app_s, db: db_s}, {fe: 1, app: 1}),
        Page(
            "Search",
            1,
            {fe: 0.0002, app: 2 * app_s, db: db_s},
            {fe: 1, app: 1},
            labels={db: "SELECT * FROM items WHERE title LIKE ?"},
        ),
    ]
    return System(list(tiers), servers, pages, users=users, think_s=1.0, seed=seed)


def test_a_database_saturated_throughout_is_named_with_n_star_at_least_one(tmp_path):
    # one core at 4 ms: 250/s of capacity for ~400/s offered by 400 users thinking 1 s; the queue
    # (~150) sits at the database (the app has threads and connections for everyone), and no
    # window of the trace shows the database below its knee
    fine, truth, _ = analysed(shop(), tmp_path)
    assert truth == {"frontend": 0.0, "app": 0.0, "postgres": 1.0}
    assert fine.verdict.kind == "single" and fine.verdict.tiers == ["postgres"]
    assert fine.saturated_share["postgres"] >= 0.9
    assert fine.saturated_share["app"] == 0.0 and fine.saturated_share["frontend"] == 0.0
    ns = fine.n_star["db1"]
    assert math.isfinite(ns.n_star) and ns.n_star >= 1 and ns.basis == "queue signature"
    # the queue signature: each request found ahead costs about 1 / X (X = 250/s: 4 ms)
    assert "per request found in the server" in ns.method
    # every N* is a number of requests (>= 1), never a utilisation
    assert all(v.n_star >= 1 for v in fine.n_star.values())


@pytest.mark.parametrize("with_events", [False, True])
def test_an_app_frozen_every_second_alternates_with_the_database(tmp_path, with_events):
    # the app freezes 150 ms every second (SIGSTOP-like); meanwhile ~60 requests pile up in it,
    # and when it thaws they reach the database (one core, 1.5 ms: 60 % busy) at once
    system = shop(db_s=0.0015, app_cores=2, freezes=periodic(0.51, 1.0, 0.15, 60))
    fine, truth, _ = analysed(system, tmp_path, events=with_events)
    # by construction: the app is saturated in its 3 frozen windows a second plus the drain after
    assert 0.15 <= truth["app"] <= 0.25 and truth["postgres"] > 0.2
    assert fine.verdict.kind == "alternating" and set(fine.verdict.tiers) == {"app", "postgres"}
    for tier in ("app", "postgres"):
        assert abs(fine.saturated_share[tier] - truth[tier]) <= 0.05, (tier, fine.saturated_share, truth)
    assert fine.saturated_share["frontend"] == 0.0
    # the frozen windows are found from the requests alone: none of them completed anything
    app = fine.series.filter(pc.equal(fine.series.column("server"), "app1"))
    stalled = np.asarray(app.column("share_stalled"))
    assert (stalled >= 0.99).sum() >= 2 * int(DURATION_S) - 2  # two whole windows in each 150 ms freeze


def test_two_saturated_servers_of_one_tier(tmp_path):
    # two app servers of one core each, 4 ms a request: 500/s of capacity for ~600/s offered;
    # the database (4 cores, 0.5 ms) has room to spare
    system = shop(db_cores=4, db_s=0.0005, users=600, app_cores=1, app_servers=2, app_s=0.004)
    fine, truth, _ = analysed(system, tmp_path)
    assert truth["app"] >= 0.95 and truth["postgres"] == 0.0
    assert fine.verdict.kind == "single" and fine.verdict.tiers == ["app"]
    assert fine.saturated_share["app"] >= 0.85
    assert fine.saturated_share["postgres"] <= 0.02
    assert {"app1", "app2"} <= set(fine.n_star)


def test_a_queue_for_connections_is_inherited_from_the_database(tmp_path):
    # the database saturated as in the first case, but each app server has 8 connections: the
    # queue now waits at the app for a connection (its exclusive load is high), not at the database
    fine, truth, _ = analysed(shop(connections=8), tmp_path)
    assert truth["postgres"] == 1.0 and truth["app"] == 0.0
    assert fine.verdict.kind == "single" and fine.verdict.tiers == ["postgres"]
    assert "queue amplification" in fine.verdict.evidence


def test_a_light_system_has_no_saturated_tier_and_no_utilisation_as_n_star(tmp_path):
    # 50 users: the database (one core, 4 ms) is 20 % busy, the app 5 %
    fine, truth, _ = analysed(shop(users=50), tmp_path)
    assert max(truth.values()) <= 0.02
    assert fine.verdict.kind == "none"
    assert fine.verdict.confidence >= 0.5
    assert all(v.n_star >= 1 for v in fine.n_star.values())


def test_a_trace_too_short_gives_no_verdict(tmp_path):
    fine, _, _ = analysed(shop(), tmp_path, duration_s=1.5)
    assert fine.verdict.kind == "insufficient" and fine.verdict.confidence == 0.0
    assert "not enough data" in fine.verdict.text


def test_a_caller_saturated_on_its_own_cores_with_its_callee_is_not_its_queue(tmp_path):
    # the app (one core, ~4 ms a page) and the database (one core, 4 ms) have the same capacity
    # and both queue for their cores, with connections for everyone: the app's exclusive load is
    # its own, and its requests are slow after their last query too (rule 2 must not give the
    # app's windows to the database)
    fine, truth, _ = analysed(shop(app_cores=1, app_s=0.0032, db_cores=1, db_s=0.004), tmp_path)
    assert truth["app"] >= 0.3 and truth["postgres"] >= 0.3
    assert fine.verdict.kind == "several" and sorted(fine.verdict.tiers) == ["app", "postgres"], fine.verdict
    assert abs(fine.saturated_share["app"] - truth["app"]) <= 0.15
    assert abs(fine.saturated_share["postgres"] - truth["postgres"]) <= 0.15
