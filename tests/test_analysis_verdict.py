"""The rules that make the verdict right on traced runs: parents resolved among rows sharing one
request id (X-Request-Id / sqlcommenter), a paused server holding requests counts as saturated,
and the headline combining the fine-grained verdict with the white-box saturated resources.

Ground truth is arithmetic on hand-built tables (every interval chosen here) and the simulator."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest

from tierscope.analysis.alternation import Verdict
from tierscope.analysis.experiment import UNTRACED_CAP, untraced_tiers, without_tiers
from tierscope.analysis.fine import analyze_fine
from tierscope.analysis.pauses import paused_share_above
from tierscope.analysis.summary import corroborate
from tierscope.analysis.windows import Intervals, parent_rows
from tierscope.simulate import parse_spec, simulate
from tierscope.trace.link import link_transactions

MS = 1_000_000
BASE = 1_700_000_000_000_000_000  # a multiple of 50 ms


def traced(rows: list[tuple]) -> pa.Table:
    """A requests table as the tracer writes it: (tier, server, request_id, arrival_ms, departure_ms)."""
    proto = {"web": "http", "app": "http", "db": "postgres"}
    return pa.table(
        {
            "tier": [r[0] for r in rows],
            "server": [r[1] for r in rows],
            "request_id": [r[2] for r in rows],
            "parent_id": pa.nulls(len(rows), pa.string()),
            "arrival_ns": pa.array([BASE + int(r[3] * MS) for r in rows], pa.int64()),
            "departure_ns": pa.array([BASE + int(r[4] * MS) for r in rows], pa.int64()),
            "protocol": [proto[r[0]] for r in rows],
            "source": ["trace"] * len(rows),
        }
    )


def test_parents_are_found_among_rows_sharing_one_request_id():
    # one page: web 0-100 ms, app 5-95 ms, three SQL statements inside; a second page id "b"
    t = traced(
        [
            ("db", "db1", "a", 10, 20),
            ("web", "web1", "a", 0, 100),
            ("db", "db1", "a", 30, 40),
            ("app", "app1", "a", 5, 95),
            ("db", "db1", "a", 50, 60),
            ("web", "web1", "b", 200, 210),
            ("app", "app1", "b", 201, 209),
        ]
    )
    linked = link_transactions(t)
    ids = linked.column("request_id").to_pylist()
    # the page's id stays on its web row; the rows that carried it downstream get ids of their own
    assert ids[1] == "a" and ids[5] == "b" and len(set(ids)) == 7
    assert all(ids[i].startswith("a/") for i in (0, 2, 3, 4)) and ids[6].startswith("b/")
    assert linked.column("parent_id").to_pylist() == [ids[3], None, ids[3], "a", ids[3], None, "b"]
    assert linked.column("transaction").to_pylist() == ["a"] * 5 + ["b"] * 2
    # the SQL rows' parent is the app row (3), the app row's the web row (1), web rows are roots
    assert parent_rows(linked).tolist() == [3, -1, 3, 1, 3, -1, 5]


def test_rows_without_ids_have_no_parent_unless_time_finds_one():
    # an app row the tracer saw without an X-Request-Id and without addresses: no parent; a null
    # parent id must not match a null request id
    t = traced(
        [
            ("web", "web1", "a", 0, 100),
            ("app", "app1", None, 5, 95),
            ("web", "web1", "b", 200, 210),
            ("app", "app1", "b", 201, 209),
        ]
    )
    linked = link_transactions(t)
    assert parent_rows(linked).tolist() == [-1, -1, -1, 2]
    assert linked.column("request_id").to_pylist()[1].startswith("app1#")  # its row key
    unique = pa.table(
        {
            "tier": ["web", "app", "web"],
            "server": ["w", "a", "w"],
            "request_id": ["x", None, None],
            "parent_id": [None, None, "x"],
            "arrival_ns": [BASE, BASE, BASE],
            "departure_ns": [BASE + 9] * 3,
        }
    )
    assert parent_rows(unique).tolist() == [-1, -1, 0]


def test_exclusive_load_of_a_caller_waiting_on_shared_id_children():
    # the app request is in its server 0-100 ms and waits on SQL 10-40 and 50-90: its own time is
    # 10 + 10 + 10 = 30 ms of the first two 50 ms windows: exclusive load 20/50 then 10/50
    t = traced(
        [
            ("web", "web1", "a", 0, 100),
            ("app", "app1", "a", 0, 100),
            ("db", "db1", "a", 10, 40),
            ("db", "db1", "a", 50, 90),
        ]
    )
    fg = analyze_fine(link_transactions(t))
    assert fg.exclusive
    s = fg.series.to_pylist()
    app = [r for r in s if r["server"] == "app1"]
    assert [round(r["load"], 6) for r in app] == [1.0, 1.0, 0.0]
    assert [round(r["load_exclusive"], 6) for r in app] == [0.4, 0.2, 0.0]
    web = [r for r in s if r["server"] == "web1"]
    assert [round(r["load_exclusive"], 6) for r in web] == [0.0, 0.0, 0.0]


def test_paused_share_above_counts_only_paused_time_with_requests_in_the_server():
    # server 0: requests [0, 100) and [60, 80) ms; pause [20, 70) ms. Windows of 50 ms.
    # threshold 0: paused and busy 20-50 (30 ms) and 50-70 (20 ms) -> 0.6, 0.4, 0
    # threshold 1: paused with two requests in the server: 60-70 -> 0, 0.2, 0
    starts = np.array([0, 60]) * MS
    ends = np.array([100, 80]) * MS
    parts = [Intervals(np.zeros(2, np.int32), starts.astype(np.int64), ends.astype(np.int64), +1)]
    spans = {0: (np.array([20 * MS], np.int64), np.array([70 * MS], np.int64))}
    busy = paused_share_above(parts, spans, np.zeros(1), 1, 3, 50 * MS)
    assert busy[0].tolist() == pytest.approx([0.6, 0.4, 0.0])
    two = paused_share_above(parts, spans, np.ones(1), 1, 3, 50 * MS)
    assert two[0].tolist() == pytest.approx([0.0, 0.2, 0.0])
    # a child interval (time downstream) is not the server's own: exclusive level drops to 0
    child = Intervals(np.zeros(1, np.int32), np.array([20 * MS], np.int64), np.array([45 * MS], np.int64), -1)
    excl = paused_share_above(parts + [child], spans, np.zeros(1), 1, 3, 50 * MS)
    assert excl[0].tolist() == pytest.approx([0.1, 0.4, 0.0])


def test_a_paused_server_holding_requests_is_saturated_even_without_a_plateau():
    # a lightly loaded server (never past any knee) stopped for 100 ms while holding one request
    rows = [("app", "app1", f"r{i}", 200 * i, 200 * i + 2) for i in range(60)]
    rows.append(("app", "app1", "long", 1000, 1120))
    t = traced(rows)
    events = pa.table(
        {
            "start_ns": [BASE + 1010 * MS],
            "end_ns": [BASE + 1110 * MS],
            "host": ["app1"],
            "kind": ["injected_pause"],
            "detail": [""],
        }
    )
    fg = analyze_fine(t, events)
    assert not np.isfinite(fg.n_star["app1"].n_star)
    sat = np.flatnonzero(fg.tier_saturated()["app"])
    # paused and busy: 1010-1050 (0.8 of window 20), 1050-1100 (1.0 of window 21), 1100-1110 (0.2)
    assert sat.tolist() == [20, 21]
    busy = [r["share_paused_busy"] for r in fg.series.to_pylist()][19:23]
    assert busy == pytest.approx([0.0, 0.8, 1.0, 0.2])
    without = analyze_fine(t)
    assert not without.tier_saturated()["app"].any()


def test_simulated_freezes_still_give_an_alternating_verdict_with_the_pause_rule():
    # the simulator counts a frozen server holding a request as saturated: the rule agrees
    app = {
        "name": "app",
        "cores": 2,
        "threads": 2000,
        "service_ms": 1.0,
        "freeze": {"period_s": 1.0, "duration_s": 0.25},
    }
    spec = parse_spec(
        {
            "seed": 7,
            "duration_s": 20,
            "warmup_s": 1,
            "workload": {"users": 600, "think_time_s": 1.0, "index_of_dispersion": 1},
            "tier": [
                {"name": "web", "cores": 2, "threads": 2000, "service_ms": 0.2},
                app,
                {"name": "db", "cores": 2, "threads": 2000, "service_ms": 2.0},
            ],
        }
    )
    sim = simulate(spec)
    fg = analyze_fine(sim.requests, sim.events)
    assert fg.verdict.kind == "alternating", fg.verdict
    paused = np.asarray(fg.series.column("share_paused_busy"))
    assert paused.max() == pytest.approx(1.0)


V = lambda kind, tiers: Verdict(kind, tiers, "", 0.8, "")  # noqa: E731


def test_several_at_once_with_one_saturated_resource_downstream_is_that_tier():
    head, extra = corroborate(
        V("several", ["web", "app", "db"]), {"db": ["db1 cpu_util above 95 % in 97 % of the samples"]}, "at 450 users"
    )
    assert head is not None and head.startswith("Single bottleneck at db: db1 cpu_util")
    assert "web and app were saturated at the same time only as its callers" in head
    assert extra == ""


def test_several_at_once_is_kept_when_the_saturated_resource_is_upstream_or_on_two_tiers():
    # a saturated web host with app and db saturated too: the callees are not explained by it
    head, extra = corroborate(V("several", ["web", "db"]), {"web": ["web1 cpu_util"]}, "at 9 users")
    assert head is None and "web1 cpu_util" in extra
    head, _ = corroborate(V("several", ["app", "db"]), {"app": ["app1 cpu"], "db": ["db1 cpu"]}, "x")
    assert head is None


def test_an_upstream_single_tier_without_a_saturated_resource_waits_on_the_saturated_one():
    # at the analysed point nginx queues (it cannot hand requests to the app server) while the
    # app host's CPU is pegged: the app is the bottleneck
    head, extra = corroborate(
        V("single", ["web"]),
        {"app": ["app1 cpu_util above 95 % in 97 % of the samples"]},
        "at 300 users",
        same_point=True,
    )
    assert head is not None and head.startswith("Single bottleneck at app: app1 cpu_util")
    assert "the web tier, saturated in the fine-grained analysis, has no saturated resource" in head
    # two saturated tiers: no single explanation
    head, _ = corroborate(V("single", ["web"]), {"app": ["a"], "db": ["d"]}, "x", same_point=True)
    assert head is None


def test_single_and_alternating_verdicts_are_not_overruled():
    head, extra = corroborate(V("single", ["db"]), {"db": ["db1 cpu_util"]}, "at 450 users")
    assert head is None and extra == " The white box agrees: db1 cpu_util at 450 users."
    # the white box read at another level than the analysed point's: cited, not overruling
    head, extra = corroborate(V("single", ["app"]), {"db": ["db1 cpu_util"]}, "at 450 users", same_point=False)
    assert head is None and "points elsewhere too" in extra
    # a tier named downstream of the saturated resource is not explained by it
    head, extra = corroborate(V("single", ["db"]), {"app": ["app1 cpu_util"]}, "at 300 users")
    assert head is None and "points elsewhere too: app1 cpu_util at 300 users" in extra
    head, extra = corroborate(V("alternating", ["app", "db"]), {"db": ["db1 cpu_util"]}, "x")
    assert head is None and extra == ""
    assert corroborate(V("several", ["app", "db"]), {}, "x") == (None, "")


def test_a_server_saturated_throughout_gets_its_plateau_from_the_measured_service_time():
    from tierscope.analysis.saturation import saturation_point

    # 600 windows pegged at 100 completions/s (± noise) with 25-35 requests in the server; the
    # requests that found it idle took S = 5 ms: TPmax x S = 0.5 is a utilisation (half a core
    # busy at the plateau), and a server works on at least one request: N* = 1, load / N* ~ 30
    rng = np.random.default_rng(3)
    load = rng.uniform(25, 35, 600)
    thr = 100 * rng.normal(1, 0.05, 600)
    ns = saturation_point(load, thr, service_s=0.005)
    assert ns.plateau_found and "saturated throughout" in ns.method
    assert ns.n_star == 1.0 and ns.basis == "saturated throughout"
    # the same windows without a measured service time: no rise in the data, no N*
    assert not np.isfinite(saturation_point(load, thr).n_star)
    # a measured service time but a queue only ~6 x N* (S = 50 ms: N* = 5): not enough
    short = saturation_point(load, thr, service_s=0.05)
    assert not np.isfinite(short.n_star) and "never varied" in short.method


def test_a_server_never_idle_takes_its_service_time_from_a_lower_level():
    from tierscope.analysis.fine import idle_service_times

    # pegged: a request arrives every 2.5 ms and stays 100 ms, so ~40 are always in the server and
    # only the very first found it idle; 400 completions/s
    pegged = traced([("db", "db1", f"p{i}", 2.5 * i, 2.5 * i + 100) for i in range(8000)])
    alone = analyze_fine(pegged)
    assert not np.isfinite(alone.n_star["db1"].n_star)
    # a lower level: one request every 10 ms lasting 2.5 ms, always found idle
    quiet = traced([("db", "db1", f"q{i}", 10 * i, 10 * i + 2.5) for i in range(500)])
    measured = idle_service_times(quiet)
    assert measured["db1"][1] == 500 and measured["db1"][0] == pytest.approx(0.0025)
    fg = analyze_fine(pegged, service_hints={"db1": measured["db1"][0]})
    ns = fg.n_star["db1"]
    # N* = TPmax x S = 400/s x 2.5 ms = 1; the load of 40 is 40 x N*: saturated throughout
    assert ns.n_star == pytest.approx(1.0, rel=0.05)
    assert "lower workload level" in ns.method and "saturated throughout" in ns.method
    # a trace of one tier cannot tell the tier's own saturation from that of what is behind it
    assert fg.verdict.kind == "single" and fg.verdict.tiers == ["db"]
    assert fg.verdict.text == "single bottleneck at db or behind it (one tier in the trace: cannot tell which)"
    assert fg.verdict.confidence <= 0.45 and "one tier only (db)" in fg.verdict.evidence
    assert fg.saturated_share["db"] > 0.95


def test_the_simulators_alternating_example_without_its_events_table():
    """`tierscope simulate`'s alternating example (app frozen ~150 ms a second) is named the same
    with and without its events table: the freezes show in the requests (stalls)."""
    import tomllib
    from pathlib import Path

    import pyarrow.compute as pc

    from tierscope import simulate as sim
    from tierscope.analysis.windows import interval_ratio

    spec = tomllib.loads((Path(__file__).parent.parent / "examples/simulate/alternating.toml").read_text())
    run = sim.simulate(sim.parse_spec(spec))
    requests = run.requests.filter(pc.not_equal(run.requests.column("tier"), "client"))
    with_events = analyze_fine(requests, run.events)
    without = analyze_fine(requests)
    for fg in (with_events, without):
        assert fg.verdict.kind == "alternating" and set(fg.verdict.tiers) == {"app", "db"}, fg.verdict
    # the truth: windows the simulator's saturation intervals cover for at least half
    truth = run.saturation_truth
    w = without.window_ns
    for tier in ("app", "db"):
        rows = truth.filter(pc.equal(truth.column("tier"), tier))
        cover = interval_ratio(
            np.asarray(rows.column("start_ns")),
            np.asarray(rows.column("end_ns")),
            without.base_ns,
            without.n_windows,
            w,
        )
        share = float((cover >= 0.5).mean())
        assert abs(without.saturated_share[tier] - share) <= 0.08, (tier, without.saturated_share, share)
        assert abs(without.saturated_share[tier] - with_events.saturated_share[tier]) <= 0.05


def test_a_tier_with_no_traced_request_caps_the_verdict_and_is_named():
    requests = pa.table({"tier": ["app", "db", "db"], "server": ["app1", "db1", "db1"]})
    # web has a server but no row (its capture saw nothing); the middleware tier has no server
    assert untraced_tiers({"web": 1, "app": 1, "middleware": 0, "db": 1}, requests) == ["web"]
    assert untraced_tiers({"app": 1, "db": 2}, requests) == []
    assert untraced_tiers(None, requests) == []
    sure = Verdict("single", ["db"], "single bottleneck at db", 0.97, "db 80% saturated")
    capped = without_tiers(sure, ["web"])
    assert capped.confidence == UNTRACED_CAP < 0.5 and (capped.kind, capped.tiers) == ("single", ["db"])
    assert capped.evidence.startswith("db 80% saturated; no request traced at web")
    assert without_tiers(dataclasses.replace(sure, confidence=0.3), ["web"]).confidence == 0.3


def test_a_pool_pinned_upstream_of_a_saturated_cpu_is_its_queue_not_a_bottleneck():
    """db1's CPU saturated and app1's pool of connections pinned at the same level: the pool is the
    queue waiting on db1 (hardware first, seed 004 §5), so the white box names db1 alone; with
    no hardware saturated the pinned pool is named."""
    from types import SimpleNamespace

    import pyarrow as pa

    from tierscope.analysis.summary import whitebox_saturated_tiers

    def data(saturated):
        shares = pa.table(
            {
                "host": [h for h, _ in saturated],
                "metric": [m for _, m in saturated],
                "users": [400.0] * len(saturated),
                "share_above": [0.8] * len(saturated),
            }
        )
        requests = pa.table({"server": ["web1", "app1", "db1"], "tier": ["web", "app", "db"]})
        return SimpleNamespace(
            focus_config="c",
            blackbox={"c": SimpleNamespace(max_throughput_users=400.0)},
            whitebox={"c": SimpleNamespace(saturated={400.0: saturated}, shares=shares)},
            fine_users=400.0,
            requests=requests,
        )

    both = whitebox_saturated_tiers(data([("app1", "connections_util"), ("db1", "cpu_util")]))[0]
    assert both == {"db": ["db1 cpu_util above 95 % in 80 % of the samples"]}
    pool_alone = whitebox_saturated_tiers(data([("app1", "connections_util")]))[0]
    assert list(pool_alone) == ["app"]
    # a pool pinned downstream of a saturated app CPU is not the app CPU's queue: both are named
    downstream = whitebox_saturated_tiers(data([("app1", "cpu_util"), ("db1", "connections_util")]))[0]
    assert sorted(downstream) == ["app", "db"]


def test_the_white_box_is_read_past_the_maximum_throughput_when_nothing_is_saturated_there():
    """A real demo run (2026-11-30, `test_fidelity`'s database on a quarter core): the maximum
    throughput fell on the knee's level, 150 users, by 1.3 % over 450 users, where the database's CPU
    was saturated; at 150 it ran at 87 %, nothing saturated. The headline's white box (as the
    report's list and the study's bottleneck already did) is read at the first higher level where a
    resource is saturated, and at the maximum's own level when one is saturated there or none is
    anywhere past it."""
    from tierscope.analysis.summary import saturated_level

    db = [("db1", "cpu_util")]
    assert saturated_level(150.0, {50.0: [], 150.0: [], 450.0: db}) == 450.0
    assert saturated_level(150.0, {50.0: [], 150.0: db, 450.0: db}) == 150.0
    assert saturated_level(150.0, {50.0: db, 150.0: [], 450.0: []}) == 150.0  # not below the maximum
    assert saturated_level(150.0, {50.0: [], 150.0: [], 300.0: [], 450.0: db}) == 450.0
