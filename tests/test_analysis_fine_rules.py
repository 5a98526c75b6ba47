"""The fine-grained analysis' rules for a callee seen only through its callers' stamps (issue 26),
each on a trace built here with a known truth: the pool rule (a callee held at a ceiling without a
queue at it: its callers' pool of connections is full), the awake-stall filter (a callee's stall
counts only where its recorder was seen awake in it) and the stuck-callee cap (a caller saturated
while its call to the callee hung may be waiting on that callee through what it does not trace).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tierscope.analysis import fine
from tierscope.analysis.alternation import Verdict
from tierscope.analysis.experiment import run_fine
from tierscope.tables import conform

MS = 1_000_000
WINDOW_NS = 50 * MS


def _table(rows: list[tuple]) -> pa.Table:
    """(tier, server, recorder, request_id, parent_id, arrival_ms, departure_ms) rows."""
    names = ["tier", "server", "recorder", "request_id", "parent_id", "arrival_ns", "departure_ns"]
    cols = list(zip(*rows))
    data = {n: list(c) for n, c in zip(names, cols)}
    data["arrival_ns"] = [int(round(x * MS)) for x in data["arrival_ns"]]
    data["departure_ns"] = [int(round(x * MS)) for x in data["departure_ns"]]
    return conform(pa.table(data), "requests")


def _pooled_app(pool: int, call_ms: float, every_ms: float, seconds: float, congested: bool) -> pa.Table:
    """An app (its own spans) taking requests at random (Poisson, one every `every_ms` on average,
    seed 1); each holds one of `pool`
    connections for a call to db1 (its CLIENT span). The db answers each call in `call_ms` whatever
    the number of calls open (`congested` False: a pg_sleep, the db idle) or shares one core
    among them (`congested` True: `call_ms` of CPU each, processor sharing)."""
    rows = []
    free = [0.0] * pool  # when each connection is next free
    n = int(seconds * 1000 / every_ms)
    arrivals = np.cumsum(np.random.default_rng(1).exponential(every_ms, n))
    open_calls: list[tuple[float, float]] = []
    for i in range(n):
        t = float(arrivals[i])
        k = int(np.argmin(free))
        start = max(t, free[k]) + 0.05
        if congested:
            # calls already open when this one starts share the core: a crude processor-sharing
            # stretch, by the number open at its start (the db's queue)
            held = sum(1 for a, b in open_calls if a <= start < b)
            length = call_ms * (1 + held)
        else:
            length = call_ms
        end = start + length
        open_calls = [(a, b) for a, b in open_calls if b > start] + [(start, end)]
        free[k] = end
        rows.append(("db", "db1", "app1", f"c{i}", f"r{i}", start, end))
        rows.append(("app", "app1", "app1", f"r{i}", None, t, end + 0.2))
    return _table(rows)


def test_a_full_pool_in_front_of_an_idle_database_is_the_callers_bottleneck():
    # two connections, 20 ms calls (a pg_sleep: the db idle), 91 requests/s at random: the pool
    # serves 100/s at most, so requests queue in the app for a connection most of the time, and
    # some find it free (the calls' times when the db was idle: the congestion's baseline)
    requests = _pooled_app(pool=2, call_ms=20.0, every_ms=11.0, seconds=20.0, congested=False)
    result, _ = run_fine(requests, None, WINDOW_NS)
    v = result.verdict
    assert v.kind == "single" and v.tiers == ["app"], (v.text, v.evidence)
    assert "pool of connections to db was full" in v.text, v.text
    # inferred from a ceiling, never more than the pool rule's confidence; and not "low" for
    # stalling awake: what the app waited on is known, its pool
    assert fine.STALLED_AWAKE_CAP < v.confidence <= fine.POOL_CONFIDENCE, v.evidence


def _pooled_app_as_on_the_wire(seconds: float = 20.0) -> pa.Table:
    """The pool of `_pooled_app` seen on the database's wire: each request holds a connection for a
    1 ms lookup, then a 20 ms pg_sleep, both labelled with their statement; and a monitor (another
    client, no parent) queries the database for 1 ms every 100 ms, beside the pool's two calls."""
    rows = []
    free = [0.0, 0.0]
    arrivals = np.cumsum(np.random.default_rng(2).exponential(11.0, int(seconds * 1000 / 11.0)))
    for i, t in enumerate(arrivals):
        k = int(np.argmin(free))
        start = max(float(t), free[k]) + 0.05
        rows.append(("db", "db1", None, f"l{i}", f"r{i}", start, start + 1.0, "SELECT * FROM items WHERE id = $1"))
        rows.append(("db", "db1", None, f"s{i}", f"r{i}", start + 1.1, start + 21.1, "SELECT pg_sleep($1)"))
        free[k] = start + 21.1
        rows.append(("app", "app1", "app1", f"r{i}", None, float(t), start + 21.3, "GET /page"))
    for j, t in enumerate(np.arange(5.0, seconds * 1000, 100.0)):
        rows.append(("db", "db1", None, f"m{j}", None, float(t), float(t) + 1.0, "SELECT * FROM pg_stat_activity"))
    table = _table([r[:7] for r in rows])
    return table.set_column(table.schema.get_field_index("label"), "label", pa.array([r[7] for r in rows]))


def test_a_full_pool_seen_on_the_wire_beside_another_client_is_the_callers_bottleneck():
    # the monitor's queries lift the db's per-window maximum to 3 in about half of the windows, and
    # the fast lookups find it idle more often than the sleeps: neither hides the pool of 2 (the db
    # held 2 calls nearly all the time, more only for the monitor's millisecond; each statement took
    # as long at the ceiling as when the db was idle)
    requests = _pooled_app_as_on_the_wire()
    result, _ = run_fine(requests, None, WINDOW_NS)
    v = result.verdict
    assert v.tiers == ["app"] and "pool of connections to db was full" in v.text, (v.text, v.evidence)


def test_a_db_slowing_with_its_calls_is_no_full_pool():
    # the same pool and arrivals, but each call open beside another takes twice as long (a queue at
    # the db, 10 ms of work each): its calls are congested, so the ceiling is the db's own and the
    # pool rule stays silent
    requests = _pooled_app(pool=2, call_ms=10.0, every_ms=11.0, seconds=20.0, congested=True)
    result, _ = run_fine(requests, None, WINDOW_NS)
    v = result.verdict
    assert "pool of connections" not in v.text and v.tiers == ["db"], (v.text, v.evidence)


def _stamped(awake_ms: list[float]) -> pa.Table:
    """app1 records its own requests and its calls to db1. A call to db1 is open from 100 to
    200 ms; app1 also stamped the arrivals in `awake_ms` (requests of its own, 1 ms each) and, on
    either side, one request a millisecond at 0-90 ms and 210-300 ms."""
    rows = [("db", "db1", "app1", "c0", "r0", 100.0, 200.0), ("app", "app1", "app1", "r0", None, 99.0, 201.0)]
    times = [*np.arange(0.0, 90.0, 1.0), *awake_ms, *np.arange(210.0, 300.0, 1.0)]
    for j, t in enumerate(times):
        rows.append(("app", "app1", "app1", f"a{j}", None, float(t), float(t) + 0.5))
    return _table(rows)


def test_a_callee_stall_counts_only_where_its_recorder_was_seen_awake():
    stall = (np.asarray([100 * MS]), np.asarray([200 * MS]))
    # app1 took a request at 150 ms while db1 held the call: awake, so db1 held it: the stall stays
    a, b = fine._stalls_while_awake(_stamped([150.0]), "db1", stall, 0)
    assert list(a) == [100 * MS] and list(b) == [200 * MS]
    # app1 stamped nothing between 100 and 200 ms (a busy event loop, a frozen process): the call's
    # end is the first thing it stamped after, and db1 may have answered long before: dropped
    a, b = fine._stalls_while_awake(_stamped([]), "db1", stall, 0)
    assert a.size == 0 and b.size == 0
    # a stamp in the last tenth of the stall (the replies it took on waking) is not being awake in it
    a, b = fine._stalls_while_awake(_stamped([195.0]), "db1", stall, 0)
    assert a.size == 0


def test_a_caller_saturated_while_its_call_hung_is_capped_and_says_why():
    # app1's calls to db1 take 1 ms, except one that hung from 1000 to 1600 ms; the verdict names
    # app saturated in windows 20-31 (1000-1600 ms): mostly while the call was stuck
    rows = []
    for i in range(200):
        t = i * 10.0
        end = 1600.0 if i == 100 else t + 1.0
        rows.append(("db", "db1", "app1", f"c{i}", f"r{i}", t, end))
        rows.append(("app", "app1", "app1", f"r{i}", None, t, end + 0.5))
    requests = _table(rows)
    n_windows = 41
    sat = np.zeros(n_windows, bool)
    sat[20:32] = True
    verdict = Verdict(kind="single", tiers=["app"], text="single bottleneck at app", confidence=0.9, evidence="e")
    capped = fine._stuck_callee(verdict, requests, {"db": "app"}, {"app": sat, "db": np.zeros(n_windows, bool)},
                                0, WINDOW_NS)  # fmt: skip
    assert capped.confidence <= fine.STUCK_CALLEE_CAP and "stuck" in capped.evidence, capped
    # saturated elsewhere (windows 0-11), while no call hung: unchanged
    early = np.zeros(n_windows, bool)
    early[0:12] = True
    same = fine._stuck_callee(verdict, requests, {"db": "app"}, {"app": early, "db": np.zeros(n_windows, bool)},
                              0, WINDOW_NS)  # fmt: skip
    assert same == verdict
