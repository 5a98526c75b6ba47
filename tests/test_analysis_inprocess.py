"""Traces recorded inside the processes they describe (issue 26): the independent simulator's runs
exported as an OpenTelemetry SDK would record them (`independent_sim.write_otlp_inprocess`): every
time stamped by the process that records it — nothing while it is frozen, everything that happened
meanwhile at the thaw — and the database seen only through the app's CLIENT spans. The truth is the
simulator's own state (`truth_shares`: which server was frozen holding requests or had a queue for
its cores); the silences are checked against the freezes the test injected.
"""

from __future__ import annotations

import numpy as np
import pytest

from independent_sim import Page, Server, System, freeze_events, periodic, simulate, truth_shares, write_otlp_inprocess
from tierscope.analysis.experiment import analyze_files, run_fine
from tierscope.analysis.silences import callee_stops, recorder_silences

DURATION_S = 24.0
WARMUP_S = 4.0
FREEZE_S = 0.15


def shop(db_s: float, users: int = 400, app_cores: int = 2, freezes=(), seed: int = 1, db_freezes=()) -> System:
    servers = [
        Server("frontend", "fe1", cores=8),
        Server("app", "app1", cores=app_cores, threads=1000, connections=1000, freezes=list(freezes)),
        Server("postgres", "db1", cores=1, freezes=list(db_freezes)),
    ]
    pages = [
        Page("ViewItem", 3, {"frontend": 0.0002, "app": 0.001, "postgres": db_s}, {"frontend": 1, "app": 1}),
        Page(
            "Search",
            1,
            {"frontend": 0.0002, "app": 0.002, "postgres": db_s},
            {"frontend": 1, "app": 1},
            labels={"postgres": "SELECT * FROM items WHERE title LIKE ?"},
        ),
    ]
    return System(["frontend", "app", "postgres"], servers, pages, users=users, think_s=1.0, seed=seed)


#: What the SDK sees: the app, its CLIENT spans to the database; the front (nginx, say) exports nothing.
BLIND = ("frontend", "postgres")


def analysed(system: System, tmp_path, with_events: bool = False, blind: tuple[str, ...] = BLIND):
    result = simulate(system, DURATION_S, WARMUP_S)
    path = write_otlp_inprocess(
        result.spans, system, tmp_path / "spans.json", uninstrumented=blind, db_system="postgres"
    )
    data = analyze_files([path])
    fine = data.fine
    if with_events:
        fine, _ = run_fine(data.requests, freeze_events(system, WARMUP_S, DURATION_S), data.window_ns)
    return fine, truth_shares(result, system), data


@pytest.mark.parametrize("with_events", [False, True])
@pytest.mark.parametrize("db_traced", [False, True])
def test_a_frozen_app_alternates_with_the_database_it_releases_its_backlog_on(tmp_path, with_events, db_traced):
    # the app freezes 150 ms every second; ~60 requests pile up in it (their spans start only at the
    # thaw), its calls in flight end only at the thaw, and the backlog then reaches the database
    # (one core, 1.5 ms: 60 % busy on average) at once
    system = shop(db_s=0.0015, freezes=periodic(0.51, 1.0, FREEZE_S, 60))
    fine, truth, data = analysed(system, tmp_path, with_events, blind=("frontend",) if db_traced else BLIND)
    assert 0.15 <= truth["app"] <= 0.25 and truth["postgres"] > 0.2, truth
    # the database is named as the app's spans name it (and, untraced, stamped by the app)
    assert set(data.requests.column("tier").to_pylist()) == {"app", "postgres"}
    v = fine.verdict
    assert v.kind == "alternating" and set(v.tiers) == {"app", "postgres"}, (v.text, v.evidence)
    if db_traced:  # the database stamps its own work: the burst after each pause is its own
        assert v.confidence >= 0.8, v
    else:
        # seen only through the paused app's stamps, a database saturated by the burst and an app
        # busy taking up its backlog look the same (real Express and Flask apps do both): low
        assert v.confidence <= 0.45, v
        assert "the trace cannot tell" in v.evidence, v.evidence
    assert "transient bottlenecks alternating between app (paused" in v.text, v.text
    assert "postgres (saturated by the burst after each pause)" in v.text, v.text
    # a frozen app does not make the database look saturated while it is frozen
    assert abs(fine.saturated_share["app"] - truth["app"]) <= 0.06, (fine.saturated_share, truth)
    assert abs(fine.saturated_share["postgres"] - truth["postgres"]) <= 0.1, (fine.saturated_share, truth)


def test_the_silences_of_a_frozen_recorder_are_its_freezes(tmp_path):
    freezes = periodic(0.51, 1.0, FREEZE_S, 60)
    system = shop(db_s=0.0015, freezes=freezes)
    result = simulate(system, DURATION_S, WARMUP_S)
    path = write_otlp_inprocess(
        result.spans, system, tmp_path / "spans.json", uninstrumented=BLIND, db_system="postgres"
    )
    data = analyze_files([path])
    found = recorder_silences(data.requests)
    assert set(found) == {"app1"}, found  # the frontend and the database (never a recorder) stay silent-free
    # the gaps in the database's answers are the frozen app's, not the database's stops
    assert callee_stops(data.requests, recorder_silent=found) == {}
    start, end = found["app1"]
    epoch = 1_763_800_000
    inside = [(a, b) for a, b in freezes if a >= WARMUP_S + 0.2 and b <= WARMUP_S + DURATION_S - 0.2]
    # every freeze inside the capture is found, and nothing else
    assert len(start) == len(inside), (len(start), len(inside))
    for (a, b), s, e in zip(inside, start, end):
        s_s, e_s = s / 1e9 - epoch, e / 1e9 - epoch
        # a silence runs from the last stamp before the freeze to the thaw's first stamp
        assert a - 0.02 <= s_s <= a + 1e-6 and b - 1e-6 <= e_s <= b + 0.002, (a, b, s_s, e_s)


def test_a_frozen_app_in_front_of_an_idle_database_is_the_single_bottleneck(tmp_path):
    # same freezes, a database far from its capacity (0.2 ms a query: 8 % busy): the burst after
    # each thaw drains at once; only the app is saturated, while frozen
    system = shop(db_s=0.0002, freezes=periodic(0.51, 1.0, FREEZE_S, 60))
    fine, truth, _ = analysed(system, tmp_path)
    assert truth["postgres"] < 0.02 and truth["app"] >= 0.15, truth
    v = fine.verdict
    assert v.kind == "single" and v.tiers == ["app"], (v.text, v.evidence)
    assert v.text.startswith("single bottleneck at app (paused"), v.text
    assert fine.saturated_share["postgres"] < 0.05, fine.saturated_share


def test_a_stopped_database_seen_only_through_client_spans_is_found_from_its_callers_stamps(tmp_path):
    # the database freezes 150 ms every second (20 % busy between); the app keeps taking requests
    # and sending calls nobody answers, which all end after the thaw: the database's stops, found
    # in the app's stamps alone, are the freezes, and the verdict names the database, paused
    freezes = periodic(0.51, 1.0, FREEZE_S, 60)
    system = shop(db_s=0.0005, db_freezes=freezes)
    fine, truth, data = analysed(system, tmp_path)
    assert truth["postgres"] >= 0.15 and truth["app"] < 0.02, truth
    assert recorder_silences(data.requests) == {}  # the app never stopped stamping
    found = callee_stops(data.requests)
    assert set(found) == {"db1:5432"}, found  # the server its CLIENT spans name (server.address:port)
    start, end = found["db1:5432"]
    epoch = 1_763_800_000
    inside = [(a, b) for a, b in freezes if a >= WARMUP_S + 0.2 and b <= WARMUP_S + DURATION_S - 0.2]
    assert len(start) == len(inside), (len(start), len(inside))
    for (a, b), s_ns, e_ns in zip(inside, start, end):
        s_s, e_s = s_ns / 1e9 - epoch, e_ns / 1e9 - epoch
        # from the last answer before the freeze (or the first call sent into it) to the first after
        # it, or to the end of the gaps while its backlog drained (one core shared by ~60 calls)
        assert a - 0.01 <= s_s <= a + 0.02 and b - 1e-6 <= e_s <= b + 0.1, (a, b, s_s, e_s)
    v = fine.verdict
    assert v.kind == "single" and v.tiers == ["postgres"], (v.text, v.evidence)
    assert v.text.startswith("single bottleneck at postgres (paused"), v.text
    # without the stops: "single bottleneck at postgres" at 0.45 (the app saturated with it: blind)
    assert v.confidence >= 0.8, (v.confidence, v.evidence)


def test_a_saturated_database_seen_through_client_spans_has_no_silence(tmp_path):
    # nothing frozen, the database at one core for 4 ms a query against ~400/s offered: its queue
    # holds the app's calls; the app keeps stamping (arrivals go on): no silence, single database
    system = shop(db_s=0.004)
    fine, truth, data = analysed(system, tmp_path)
    assert truth["postgres"] >= 0.9 and truth["app"] == 0.0, truth
    assert recorder_silences(data.requests) == {}
    assert callee_stops(data.requests) == {}  # a queue at its cores: its answers go on, one after another
    v = fine.verdict
    assert v.kind == "single" and v.tiers == ["postgres"], (v.text, v.evidence)
    assert "paused" not in v.text


def test_a_light_system_recorded_in_process_has_no_silence_and_no_saturated_tier(tmp_path):
    system = shop(db_s=0.0005, users=60)
    fine, truth, data = analysed(system, tmp_path)
    assert max(truth.values()) < 0.02, truth
    assert recorder_silences(data.requests) == {}
    assert callee_stops(data.requests) == {}
    assert fine.verdict.kind == "none", (fine.verdict.text, fine.verdict.evidence)


def test_only_calls_ending_in_or_just_after_a_pause_of_their_recorder_move():
    import pyarrow as pa

    from tierscope.analysis.silences import charge_recorder_pauses
    from tierscope.tables import conform

    ms = 1_000_000
    # app1 stamps its own request (0-400 ms) and three calls to db1; it is paused 100-250 ms
    req = conform(
        pa.table(
            {
                "tier": ["app", "db", "db", "db"],
                "server": ["app1", "db1", "db1", "db1"],
                "recorder": ["app1", "app1", "app1", "app1"],
                "arrival_ns": np.array([0, 50, 60, 300], np.int64) * ms,
                "departure_ns": np.array([400, 252, 90, 310], np.int64) * ms,
            }
        ),
        "requests",
    )
    events = conform(
        pa.table(
            {
                "start_ns": np.array([100 * ms], np.int64),
                "end_ns": np.array([250 * ms], np.int64),
                "host": ["app1"],
                "kind": ["gc"],
            }
        ),
        "events",
    )
    out, merged, moved = charge_recorder_pauses(req, events)
    assert moved == 1
    dep = (np.asarray(out.column("departure_ns")) // ms).tolist()
    # the call open across the pause ends (for the database) when the pause began; the app's own
    # request and the calls before and after the pause keep their times
    assert dep == [400, 100, 90, 310]
    assert merged.num_rows == 1


def test_a_busy_caller_in_front_of_an_idle_database_is_never_a_confident_database_verdict(tmp_path):
    # the app on one core (a single event loop, one Python worker under its GIL) at 4 ms of CPU a
    # page: 250/s for the ~400/s offered; the database answers in 0.2 ms (idle 95 % of the time) but
    # the app stamps each reply only when its core comes back to the waiting request
    system = shop(db_s=0.0002, app_cores=1)
    system.pages = [Page(p.name, p.weight, {**p.cpu, "app": 0.004}, p.calls, p.labels) for p in system.pages]
    fine, truth, _ = analysed(system, tmp_path)
    assert truth["app"] >= 0.9 and truth["postgres"] < 0.02, truth
    v = fine.verdict
    # the database is seen only through the calls the saturated app stamped: the spans alone cannot
    # tell the app's delay in taking the replies from a queue at the database; a verdict naming the
    # database is never more than "low", and says why
    if v.tiers != ["app"]:
        assert v.confidence < 0.5, (v.text, v.confidence)
        assert "cannot tell app's saturation from postgres's" in v.evidence, v.evidence


def _app_and_db_calls(stop_ms: int, resume_ms: int, db_stopped: bool, threads: int = 16):
    """An app stamping its requests (one every 5 ms, 3 ms each, one 1 ms call to db1 inside) for
    2 s. Either the app is frozen from `stop_ms` to `resume_ms` (nothing stamped; what arrived
    meanwhile starts at the thaw), or the db stops answering then: the app goes on taking requests
    and sending calls until its `threads` are all waiting, then stamps nothing until the db
    answers at `resume_ms`."""
    import pyarrow as pa

    from tierscope.tables import conform

    ms = 1_000_000
    rows = {"tier": [], "server": [], "recorder": [], "request_id": [], "parent_id": [], "arrival_ns": [],
            "departure_ns": []}  # fmt: skip

    def add(tier, server, rid, parent, a, d):
        for k, v in zip(rows, (tier, server, "app1", rid, parent, int(a * ms), int(d * ms))):
            rows[k].append(v)

    waiting = 0
    for n, t in enumerate(range(0, 2000, 5)):
        rid = f"r{n}"
        if db_stopped and stop_ms <= t < resume_ms:
            if waiting < threads:  # a free thread takes it and sends its call, which hangs
                waiting += 1
                add("db", "db1", f"c{n}", rid, t + 1, resume_ms + 0.2 * waiting)
                add("app", "app1", rid, None, t, resume_ms + 0.2 * waiting + 1)
            else:  # no thread: it waits in the socket and starts at the thaw
                add("db", "db1", f"c{n}", rid, resume_ms + 5, resume_ms + 6)
                add("app", "app1", rid, None, resume_ms + 0.01 * n % 3, resume_ms + 7)
            continue
        if not db_stopped and stop_ms <= t < resume_ms:  # frozen: stamped at the thaw
            start = resume_ms + 0.01 * (n % 50)
            add("db", "db1", f"c{n}", rid, start + 1, start + 2)
            add("app", "app1", rid, None, start, start + 3)
            continue
        add("db", "db1", f"c{n}", rid, t + 1, t + 2)
        add("app", "app1", rid, None, t, t + 3)
    return conform(pa.table(rows), "requests")


def test_a_caller_waiting_on_a_stopped_callee_is_not_paused_a_frozen_one_is():
    # the same silence of app1's stamps from ~1080 ms to 1200 ms: frozen, it is app1's pause; with
    # the db stopped at 1000 ms, app1 went on sending calls that none answered before falling silent
    frozen = recorder_silences(_app_and_db_calls(1000, 1200, db_stopped=False))
    assert set(frozen) == {"app1"} and frozen["app1"][0].size == 1, frozen
    waiting = _app_and_db_calls(1000, 1200, db_stopped=True)
    assert recorder_silences(waiting) == {}
    # and the verdict names the database, stalled while the app kept taking requests (without the
    # rule: "single bottleneck at app (paused 1 time, median 124 ms)")
    fine, _ = run_fine(waiting, None, 50_000_000)
    assert fine.verdict.tiers == ["db"] and "paused" not in fine.verdict.text, fine.verdict
