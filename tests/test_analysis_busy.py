"""A busy caller from its own stamps (`tierscope.analysis.busy`, issue 26): a single event loop
that runs one request's code at a time stamps nothing else meanwhile, and the replies of its other
requests' calls wait for it, so their CLIENT spans end late and the database behind them looks
saturated. The ground truth is an event-loop simulation in this file: which chunks of code ran,
for how long, while which requests were held."""

from __future__ import annotations

import heapq

import numpy as np
import pyarrow as pa

from tierscope.analysis import busy, fine
from tierscope.analysis.experiment import run_fine
from tierscope.analysis.windows import parent_rows
from tierscope.tables import conform

MS = 1_000_000
WINDOW_NS = 50 * MS


def _event_loop(
    every_ms: float, code_ms: float, db_ms: float, db_servers: int, seconds: float, seed: int = 1
) -> tuple[pa.Table, float]:
    """An app with one event loop (as Node's) and its own spans: requests arrive at random (Poisson,
    one every `every_ms`); the loop takes each up (its SERVER span starts), runs `code_ms` of its
    code, sends one call to the db (its CLIENT span starts), and when it takes the reply up (the
    CLIENT span ends) runs 0.2 ms more and answers. The db serves calls in `db_ms` on `db_servers`
    servers, first come first served. The loop runs one piece of code at a time, in the order the
    work became ready. Returns the rows and the truth: the time (ns) the loop spent in pieces of
    code of at least busy.MIN_GAP_NS while it held at least one other request."""
    rng = np.random.default_rng(seed)
    n = int(seconds * 1000 / every_ms)
    arrivals = np.cumsum(rng.exponential(every_ms, n))
    ready: list[tuple[float, int, int, str]] = []  # (ready at, order, request, "arrive" | "reply")
    order = 0
    for i, t in enumerate(arrivals):
        heapq.heappush(ready, (float(t), order, i, "arrive"))
        order += 1
    db_free = [0.0] * db_servers
    loop = 0.0
    held: set[int] = set()
    t_arr, t_ans, t_call, t_reply = {}, {}, {}, {}
    truth = 0.0
    while ready:
        at, _, i, what = heapq.heappop(ready)
        start = max(loop, at)
        if what == "arrive":
            t_arr[i] = start
            held.add(i)
            end = start + code_ms
            t_call[i] = end
            k = int(np.argmin(db_free))
            done = max(end, db_free[k]) + db_ms
            db_free[k] = done
            heapq.heappush(ready, (done, order, i, "reply"))
            order += 1
        else:
            t_reply[i] = start
            end = start + 0.2
            t_ans[i] = end
            held.discard(i)
        if end - start >= busy.MIN_GAP_NS / MS and len(held) >= 2 and what == "arrive":
            truth += (end - start) * MS
        loop = end
    rows = []
    for i in range(n):
        rows.append(("app", "app1", "app1", f"r{i}", None, t_arr[i], t_ans[i]))
        rows.append(("db", "db1:5432", "app1", f"c{i}", f"r{i}", t_call[i], t_reply[i]))
    names = ["tier", "server", "recorder", "request_id", "parent_id", "arrival_ns", "departure_ns"]
    data = {k: list(v) for k, v in zip(names, zip(*rows))}
    data["arrival_ns"] = [int(round(x * MS)) for x in data["arrival_ns"]]
    data["departure_ns"] = [int(round(x * MS)) for x in data["departure_ns"]]
    return conform(pa.table(data), "requests"), truth


def _busy_ns(requests: pa.Table) -> float:
    found = busy.busy_silences(requests, parent_rows(requests))
    return sum(float((b - a).sum()) for a, b in found.values())


def test_the_busy_silences_of_an_event_loop_are_the_code_it_ran_while_others_waited():
    # 8 ms of code a request at 90 requests/s: the loop is busy 74 % of the time; an idle db (0.5 ms)
    requests, truth = _event_loop(every_ms=11.0, code_ms=8.0, db_ms=0.5, db_servers=4, seconds=20.0)
    span = float(requests.column("departure_ns").to_numpy().max() - requests.column("arrival_ns").to_numpy().min())
    assert truth / span > 0.3  # the simulation is the busy loop it means to be
    found = _busy_ns(requests)
    assert abs(found - truth) <= 0.02 * truth, (found, truth)


def test_a_caller_waiting_on_a_saturated_database_has_no_busy_silence():
    # 0.3 ms of code, a db of one server taking 9 ms a call at 100 calls/s (90 % busy): the loop
    # idles, and its silences end with the db's replies
    requests, truth = _event_loop(every_ms=10.0, code_ms=0.3, db_ms=9.0, db_servers=1, seconds=20.0)
    assert truth == 0.0
    span = float(requests.column("departure_ns").to_numpy().max() - requests.column("arrival_ns").to_numpy().min())
    assert _busy_ns(requests) / span < 0.01


def test_waiting_for_a_pooled_connection_is_no_busy_silence():
    # one connection, 12 ms calls (a pg_sleep), 75 requests/s: requests wait in the app for the
    # connection; each call starts on the reply that freed it (40 us later), and with a clock that
    # stamps starts in whole milliseconds (Node's), even before that reply
    rows = []
    free = 0.0
    arrivals = np.cumsum(np.random.default_rng(3).exponential(13.3, 1500))
    for i, t in enumerate(arrivals):
        start = max(float(t), free) + 0.04
        end = start + 12.0
        free = end
        rows.append(("app", "app1", "app1", f"r{i}", None, float(t), end + 0.1))
        rows.append(("db", "db1:5432", "app1", f"c{i}", f"r{i}", start, end))
    names = ["tier", "server", "recorder", "request_id", "parent_id", "arrival_ns", "departure_ns"]
    for coarse in (False, True):
        data = {k: list(v) for k, v in zip(names, zip(*rows))}
        to_ns = (lambda x: int(x) * MS) if coarse else (lambda x: int(round(x * MS)))
        data["arrival_ns"] = [to_ns(x) for x in data["arrival_ns"]]
        data["departure_ns"] = [int(round(x * MS)) for x in data["departure_ns"]]
        requests = conform(pa.table(data), "requests")
        span = float(max(data["departure_ns"]) - min(data["arrival_ns"]))
        assert _busy_ns(requests) / span < 0.01, coarse


def test_a_busy_event_loop_is_named_not_the_idle_database_behind_it():
    # the loop 85 % busy (9.5 ms of code a request at 90/s): the replies of an idle db (0.5 ms)
    # wait for it, so the db's calls look long and crowded; without its busy silences the trace
    # could not tell the loop's saturation from the db's
    requests, _ = _event_loop(every_ms=11.0, code_ms=9.5, db_ms=0.5, db_servers=4, seconds=20.0)
    result, _ = run_fine(requests, None, WINDOW_NS)
    v = result.verdict
    assert v.kind == "single" and v.tiers == ["app"], (v.text, v.evidence)
    assert "ran one request's code at a time" in v.evidence
    assert v.confidence <= fine.BUSY_CAP
    # the same loop lightly loaded: nothing saturated, nothing said of busy silences
    light, _ = _event_loop(every_ms=40.0, code_ms=2.5, db_ms=0.5, db_servers=4, seconds=20.0)
    lv = run_fine(light, None, WINDOW_NS)[0].verdict
    assert lv.kind == "none", (lv.text, lv.evidence)
