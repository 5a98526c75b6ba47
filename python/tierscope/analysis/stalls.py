"""Stalls: stretches in which a server holds requests and completes none (issue 11; seed 001 §4).

A server that stops working — a stop-the-world GC, a SIGSTOP, a CFS quota used up, a VM
descheduled — keeps receiving requests and finishes none. With an `events` table the pause is
known (`analysis.pauses`); without one it is still visible in the requests alone, and that is all a
trace of someone else's system has. This module finds it there.

The server's *activity* is what it hands on: a departure (a reply) or the start of a call downstream
(a child request, when parent/child links exist). Between two consecutive activity instants the
number of requests the server holds at its own level (exclusive of those waiting downstream) can
only grow: arrivals and replies from downstream add to it, and only activity takes from it. A gap
between activity instants is a **stall** when, for a stretch of it at least `factor` times the
server's typical busy gap (the median gap between activity instants while it held a request)
and at least `min_ns` long, the server held at least `min_held` requests: several requests
present, none of them progressing, for far longer than the server usually takes to do something.
One slow request alone is not a stall (`min_held` >= 2): a server with free cores would have
served the others; with `min_held` = round(N*) + 1 the requests held are more than it can work on.

The stalled stretch starts when the level first reaches `min_held` inside the gap and ends at
the next activity. Its time is saturated time, like a paused server's while busy.
"""

from __future__ import annotations

import numpy as np

from .windows import Intervals, accumulate_intervals

#: A stall is at least this many times the server's typical gap between activity instants.
FACTOR = 10.0
#: ...and at least this long (ns): shorter stretches are service-time noise at any rate.
MIN_NS = 5_000_000


def stall_spans(
    parts: list[Intervals],
    n_servers: int,
    min_held: np.ndarray | None = None,
    factor: float = FACTOR,
    min_ns: int = MIN_NS,
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per server code: the stalled stretches as sorted (start, end) arrays of int64 ns relative to
    the parts' base (see the module docstring). `min_held[server]` defaults to 2."""
    req = parts[0]
    child = parts[1] if len(parts) > 1 else None
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for srv in range(n_servers):
        need = 2 if min_held is None else max(2, int(min_held[srv]))
        m = req.server == srv
        ups = [req.start[m]]
        downs = [req.end[m]]
        if child is not None:
            cm = child.server == srv
            ups.append(child.end[cm])  # back from downstream: held here again
            downs.append(child.start[cm])  # handed downstream: activity
        up = np.sort(np.concatenate(ups))
        down = np.sort(np.concatenate(downs))
        if down.size < 2:
            continue
        act = np.unique(down)
        # the level just after each activity instant: everything up to and including it
        after = np.searchsorted(up, act, "right") - np.searchsorted(down, act, "right")
        gap = np.diff(act)
        busy = after[:-1] >= 1
        if not busy.any():
            continue
        typical = float(np.median(gap[busy]))
        # inside gap j the level rises from after[j] by the arrivals in (act[j], act[j+1]);
        # it reaches `need` at the (need - after[j])-th of them
        missing = need - after[:-1]
        first_up = np.searchsorted(up, act[:-1], "right")  # index of the first arrival inside the gap
        reach = act[:-1].copy()
        late = missing > 0
        idx = first_up[late] + missing[late] - 1
        inside = idx < up.size
        when = np.full(int(late.sum()), np.iinfo(np.int64).max, np.int64)
        when[inside] = up[idx[inside]]
        reach[late] = when
        length = act[1:] - reach
        keep = (reach < act[1:]) & (length >= max(factor * typical, float(min_ns)))
        if keep.any():
            out[srv] = (reach[keep], act[1:][keep])
    return out


def stalled_share(
    spans: dict[int, tuple[np.ndarray, np.ndarray]], n_servers: int, n_windows: int, window_ns: int
) -> np.ndarray:
    """Share of each window (n_servers x n_windows) covered by the servers' stalls."""
    if not spans:
        return np.zeros((n_servers, n_windows))
    srv = np.concatenate([np.full(a.size, s, np.int32) for s, (a, _) in spans.items()])
    start = np.concatenate([a for a, _ in spans.values()])
    end = np.concatenate([b for _, b in spans.values()])
    limit = np.int64(n_windows) * np.int64(window_ns)
    part = Intervals(srv, np.minimum(start, limit), np.minimum(end, limit), +1)
    integral, _ = accumulate_intervals([part], n_servers, n_windows + 1, window_ns)
    return integral.reshape(n_servers, n_windows + 1)[:, :n_windows] / window_ns
