"""Heavy requests (seed 000 §4): rare requests orders of magnitude costlier than the usual request
of the same kind — e.g. a search SQL that the optimiser fails on and that reads a whole table from
disk. Rare enough to vanish in averages, heavy enough to move the bottleneck.

A request's residence is not its cost: on a saturated server it includes the queue, and when the
server stops (a CFS quota used up, a GC) every request caught in the stop waits it out, cheap or
not. So a request is judged by its **own cost**:

* its **own time**: the residence minus the time it spent in its calls downstream (parent/child
  links; no links: the residence);
* counted from when it **had room**: a request that found the server with fewer requests than
  its N* (rounded, at least 1; at its own level, those waiting downstream left out) had room at
  once; one that found L >= N* others had room when L - N* + 1 of them had been handed on
  (replies or calls downstream, the server's activity): the queue it found is not its cost.
  A server without N* (none given, or no saturation seen) never queued visibly: every request
  has room at once. Its **cost** is its own time from then;
* requests caught in a **stall** (the server held more requests than it can work on — N* + 1,
  so only for a server with N* — and handed none on, `analysis.stalls`) after it began, or
  behind others, are its victims, not heavy requests: the stall is one event, reported once in
  `stall_events` with the requests it held;
* a request is **slow** when its cost is at least `factor` times the median cost of its
  ``(tier, label)`` (default 100x: two orders of magnitude), among labels with at least
  `min_count` requests not stalled. Requests without a label are grouped under ``(no label)``;
* slow requests are **heavy** when their label is slow far more often than the server's other
  requests are as slow: a stop or a share of a busy CPU the trace cannot see (a CFS quota used
  up, a GC, processor sharing among many requests) delays whatever is in service by about the
  same time whatever its label, while a kind of request that is expensive is slow on its own.
  The label's requests at least `factor` x its median cost are compared with the other labels'
  requests at least that long (absolute time: a cheap label is 100x slower after a delay that
  leaves a costlier one at 10x, and its victims must not count as heavy): the binomial tail of
  its count at the others' rate below `ALPHA`, and its rate at least `CONCENTRATION` times
  theirs. On a server with one label nothing is compared: none are reported.
"""

from __future__ import annotations

import math
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import stalls
from .windows import arrival_levels, floor_base, parent_rows, request_intervals

DEFAULT_FACTOR = 100.0
#: a label is heavy when its rate of slow requests is this unlikely at the rate of the others...
ALPHA = 0.01
#: ...and at least this many times that rate
CONCENTRATION = 2.0
NO_LABEL = "(no label)"


def _arrow(con: duckdb.DuckDBPyConnection, query: str, params: list[Any]) -> pa.Table:
    rel = con.sql(query, params=params)
    return rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()  # duckdb 2 / 1


#: the room of a server without N*: no limit seen
UNLIMITED = 1 << 40


def _room(servers: list[str], n_star: dict[str, float] | None) -> np.ndarray:
    """Per server code: how many requests it can hold and still have room (round(N*), at least 1;
    UNLIMITED for a server without N*)."""
    out = []
    for s in servers:
        v = (n_star or {}).get(s, math.inf)
        out.append(max(1, int(round(v))) if math.isfinite(v) else UNLIMITED)
    return np.asarray(out, np.int64)


def _own_cost(
    requests: pa.Table, n_star: dict[str, float] | None
) -> tuple[Any, np.ndarray, np.ndarray, dict[int, tuple[np.ndarray, np.ndarray]], list[str], int]:
    """Per request row (of `parts[0]`): its cost in ns (module docstring), and the stalls per server
    code (relative to base), with the server names and the base."""
    base = floor_base(int(pc.min(requests.column("arrival_ns")).as_py()), 1)
    rows = parent_rows(requests)
    linked = bool((rows >= 0).any())
    parts, _tiers, servers = request_intervals(requests, base, linked, None, rows)
    level, own = arrival_levels(parts, len(servers))
    room = _room(servers, n_star)
    req = parts[0]
    child = parts[1] if len(parts) > 1 else None
    start = req.start.copy()
    for srv in range(len(servers)):
        m = np.flatnonzero((req.server == srv) & (level >= room[srv]))
        if m.size == 0:
            continue
        # it found no room: it gets some when level - room + 1 of those present have been handed on
        mine = req.server == srv
        handed: list[np.ndarray] = [req.end[mine]] + ([child.start[child.server == srv]] if child is not None else [])
        act: np.ndarray = np.sort(np.concatenate(handed))
        idx = np.searchsorted(act, req.start[m], "right") + (level[m] - room[srv])
        start[m] = np.where(idx < act.size, act[np.minimum(idx, act.size - 1)], req.end[m])
    start = np.minimum(np.maximum(start, req.start), req.end)
    cost = np.maximum(own - (start - req.start), 0.0)
    # a stall holds more than the server can work on; without N* that is not known: no stalls
    found = stalls.stall_spans(parts, len(servers), min_held=room + 1)
    return req, cost, level < room[req.server], found, servers, base


def _caught(req: Any, found: dict[int, tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Per request row: the index of the stall of its server its residence overlaps, or -1; and
    the stalls' starts by index."""
    out = np.full(req.start.size, -1, np.int64)
    offset = 0
    for srv, (a, b) in sorted(found.items()):
        m = np.flatnonzero(req.server == srv)
        # the last stall starting before the request leaves; caught if it ends after it arrives
        k = np.searchsorted(a, req.end[m], "left") - 1
        hit = (k >= 0) & (b[np.maximum(k, 0)] > req.start[m])
        out[m[hit]] = offset + k[hit]
        offset += a.size
    starts = np.concatenate([a for _, (a, _b) in sorted(found.items())]) if found else np.zeros(0, np.int64)
    return out, starts


def heavy_requests(
    requests: pa.Table, factor: float = DEFAULT_FACTOR, min_count: int = 20, n_star: dict[str, float] | None = None
) -> pa.Table:
    """The heavy requests (module docstring): tier, server, label, arrival_ns, duration_ns (the
    residence), own_ns (its cost), median_ns (the label's median cost), ratio (own / median); sorted
    by arrival. `n_star`: server -> N* (e.g. from `analyze_fine`)."""
    req, own, had_room, found, _servers, _base = _own_cost(requests, n_star)
    caught, starts = _caught(req, found)
    # held by a stop that had begun when it arrived, or behind others: a victim, never the cause
    victim = (caught >= 0) & (~had_room | (req.start >= (starts[np.maximum(caught, 0)] if starts.size else 0)))
    label = requests.column("label") if "label" in requests.column_names else pa.nulls(requests.num_rows, pa.string())
    table = pa.table(
        {
            "tier": requests.column("tier"),
            "server": requests.column("server"),
            "label": pc.fill_null(label.cast(pa.string()), NO_LABEL),
            "arrival_ns": requests.column("arrival_ns"),
            "duration_ns": pc.subtract(requests.column("departure_ns"), requests.column("arrival_ns")),
            "own_ns": pa.array(np.round(own).astype(np.int64)),
            "victim": pa.array(victim),
        }
    )
    con = duckdb.connect()
    try:
        con.register("r", table)
        slow = _arrow(
            con,
            """
            with m as (select tier, label, median(own_ns) as median_ns, count(*) as n
                       from r where not victim group by all)
            select r.tier, r.server, r.label, r.arrival_ns, r.duration_ns, r.own_ns,
                   m.median_ns::double as median_ns, r.own_ns / greatest(m.median_ns, 1) as ratio
            from r join m using (tier, label)
            where m.n >= ? and not r.victim and r.own_ns >= ? * greatest(m.median_ns, 1)
            order by r.arrival_ns
            """,
            [int(min_count), float(factor)],
        )
    finally:
        con.close()
    return slow.filter(_concentrated(slow, table.filter(pc.invert(table.column("victim"))), factor))


def _concentrated(slow: pa.Table, others: pa.Table, factor: float) -> pa.Array:
    """Per slow request: whether its label is slow far more often than the server's other labels
    are that slow (`others`: the server's requests that are not victims, with own_ns): binomial
    tail below ALPHA and a rate at least CONCENTRATION times theirs."""
    from scipy.stats import binom

    srv_all = np.asarray(others.column("server").to_pylist(), object)
    lab_all = np.asarray(others.column("label").to_pylist(), object)
    cost_all = np.asarray(others.column("own_ns"), np.int64)
    keys = list(
        zip(slow.column("server").to_pylist(), slow.column("label").to_pylist(), slow.column("median_ns").to_pylist())
    )
    keep = {}
    for srv, lab, median in set(keys):
        threshold = factor * max(median, 1.0)
        mine = srv_all == srv
        own_label = mine & (lab_all == lab)
        n_label, n_other = int(own_label.sum()), int((mine & ~own_label).sum())
        k_label = int((cost_all[own_label] >= threshold).sum())
        rate_other = (int((cost_all[mine & ~own_label] >= threshold).sum()) + 1) / (n_other + 1)
        tail = float(binom.sf(k_label - 1, n_label, min(rate_other, 1.0)))
        keep[(srv, lab, median)] = tail < ALPHA and k_label / max(n_label, 1) >= CONCENTRATION * rate_other
    return pa.array([keep[key] for key in keys], pa.bool_())


def stall_events(requests: pa.Table, n_star: dict[str, float] | None = None) -> pa.Table:
    """The stalls (`analysis.stalls`), one row each: tier, server, start_ns, end_ns, duration_ns,
    requests (how many it held: their residences overlap it), labels (the distinct labels among
    them, most frequent first, up to five, joined by " | ")."""
    req, _cost, _room, found, servers, base = _own_cost(requests, n_star)
    caught, _starts = _caught(req, found)
    tier_of: dict[str, str] = {}
    for t, s in zip(requests.column("tier").to_pylist(), requests.column("server").to_pylist()):
        tier_of.setdefault(s, t)
    labels = requests.column("label").to_pylist() if "label" in requests.column_names else [None] * requests.num_rows
    out: dict[str, list[Any]] = {
        "tier": [],
        "server": [],
        "start_ns": [],
        "end_ns": [],
        "duration_ns": [],
        "requests": [],
        "labels": [],
    }
    index = 0
    for srv, (a, b) in sorted(found.items()):
        for j in range(a.size):
            held = np.flatnonzero(caught == index)
            counts: dict[str, int] = {}
            for i in held:
                counts[labels[i] or NO_LABEL] = counts.get(labels[i] or NO_LABEL, 0) + 1
            out["tier"].append(tier_of[servers[srv]])
            out["server"].append(servers[srv])
            out["start_ns"].append(base + int(a[j]))
            out["end_ns"].append(base + int(b[j]))
            out["duration_ns"].append(int(b[j] - a[j]))
            out["requests"].append(int(held.size))
            out["labels"].append(" | ".join(sorted(counts, key=lambda k: (-counts[k], k))[:5]))
            index += 1
    return pa.table(
        {
            "tier": pa.array(out["tier"], pa.string()),
            "server": pa.array(out["server"], pa.string()),
            "start_ns": pa.array(out["start_ns"], pa.int64()),
            "end_ns": pa.array(out["end_ns"], pa.int64()),
            "duration_ns": pa.array(out["duration_ns"], pa.int64()),
            "requests": pa.array(out["requests"], pa.int64()),
            "labels": pa.array(out["labels"], pa.string()),
        }
    )


def heavy_summary(requests: pa.Table, heavy: pa.Table) -> pa.Table:
    """Per (tier, label) with heavy requests: count, all requests, share, the label's median cost and
    the heaviest one's cost (ms), first and last time seen (ns),
    and the share of the label's total residence time they account for."""
    con = duckdb.connect()
    try:
        con.register("r", requests.select(["tier", "label", "arrival_ns", "departure_ns"]))
        con.register("h", heavy)
        return _arrow(
            con,
            """
            with a as (select tier, coalesce(label, ?) as label, count(*) as requests,
                              sum(departure_ns - arrival_ns) as total_ns from r group by all)
            select h.tier, h.label, count(*) as heavy, any_value(a.requests) as requests,
                   count(*) / any_value(a.requests) as share,
                   any_value(h.median_ns) / 1e6 as median_ms, max(h.own_ns) / 1e6 as max_ms,
                   min(h.arrival_ns) as first_ns, max(h.arrival_ns) as last_ns,
                   sum(h.duration_ns) / any_value(a.total_ns) as time_share
            from h join a using (tier, label)
            group by h.tier, h.label order by heavy desc, h.tier, h.label
            """,
            [NO_LABEL],
        )
    finally:
        con.close()


def heavy_timeline(heavy: pa.Table, bin_ns: int = 1_000_000_000) -> pa.Table:
    """When they happened: heavy requests per (tier, label) per time bin (bin_start_ns, count)."""
    con = duckdb.connect()
    try:
        con.register("h", heavy)
        return _arrow(
            con,
            "select tier, label, (arrival_ns // ?) * ? as bin_start_ns, count(*) as heavy "
            "from h group by all order by bin_start_ns, tier, label",
            [int(bin_ns), int(bin_ns)],
        )
    finally:
        con.close()
