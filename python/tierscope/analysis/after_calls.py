"""Is a caller saturated on its own while its callee is? The time after its last call tells.

A caller's exclusive load (its requests minus the time inside their calls) is high in two cases
that look alike in a trace: its requests wait for a connection or thread to a saturated callee
(the callee's queue, held upstream), or they wait for the caller's own cores (or a freeze). A
connection wait comes *before* a call; a wait for the cores slows the work before the first call
and the work after the last call (rendering the page, writing the reply) alike.

So, per server that calls another, each request that made a call has a **lead** (arrival to its
first call's start) and a **tail** (its last call's end to its departure). A window is the caller's
**own** when the time its requests spent in it in their tails is at least `TAIL_SHARE` of the
time they spent in it in their leads (with at least `MIN_LOAD` requests in either phase on average):
their wait was not only before calls. Time inside the window, not departures: during a freeze
nothing departs, but the requests caught in their tails wait there. No baseline
is needed, so it works on a server saturated throughout; it reads a caller whose lead and tail
work are of the same order, and a tail much longer than the lead as "own" (when the caller is not
saturated, that says nothing: the verdict only asks about windows in which it is).
"""

from __future__ import annotations

import numpy as np

#: the tails at least this share of the leads: the caller waited after its calls too
TAIL_SHARE = 0.5
#: requests in their lead or tail needed on average in a window to judge it
MIN_LOAD = 1.0


def lead_and_tail(
    arrival_ns: np.ndarray, departure_ns: np.ndarray, parent_row: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per request, ns from its arrival to its first child call's start (lead) and from its last
    child call's end to its departure (tail), both clipped at 0; -1 for requests with no call."""
    n = arrival_ns.size
    first = np.full(n, np.iinfo(np.int64).max, np.int64)
    last = np.full(n, -1, np.int64)
    child = np.flatnonzero(parent_row >= 0)
    np.minimum.at(first, parent_row[child], arrival_ns[child])
    np.maximum.at(last, parent_row[child], departure_ns[child])
    called = last >= 0
    lead = np.where(called, np.maximum(np.minimum(first, departure_ns) - arrival_ns, 0), -1)
    tail = np.where(called, np.maximum(departure_ns - np.maximum(last, arrival_ns), 0), -1)
    return lead, tail


def time_in_windows(
    start_ns: np.ndarray, end_ns: np.ndarray, base_ns: int, window_ns: int, n_windows: int
) -> np.ndarray:
    """Per window, the total ns the intervals [start, end) spend inside it (exact: the integral
    F(t) = sum of clip(t - start, 0, end - start), evaluated at the window edges)."""
    edges = float(window_ns) * np.arange(n_windows + 1)  # relative to base_ns: no overflow, ns exact
    s = np.sort(np.asarray(start_ns, np.int64) - base_ns).astype(np.float64)
    e = np.sort(np.asarray(end_ns, np.int64) - base_ns).astype(np.float64)
    cs, ce = np.concatenate([[0.0], np.cumsum(s)]), np.concatenate([[0.0], np.cumsum(e)])
    ks, ke = np.searchsorted(s, edges, "right"), np.searchsorted(e, edges, "right")
    f = (ks * edges - cs[ks]) - (ke * edges - ce[ke])
    return np.diff(f)


def own_windows(
    arrival_ns: np.ndarray,
    departure_ns: np.ndarray,
    lead_ns: np.ndarray,
    tail_ns: np.ndarray,
    base_ns: int,
    window_ns: int,
    n_windows: int,
) -> np.ndarray:
    """One server: bool per window, its requests waited after their calls too (module docstring).
    The arrays are its requests' (`lead_and_tail`)."""
    called = tail_ns >= 0
    arrival, departure = arrival_ns[called], departure_ns[called]
    lead = time_in_windows(arrival, arrival + lead_ns[called], base_ns, window_ns, n_windows)
    tail = time_in_windows(departure - tail_ns[called], departure, base_ns, window_ns, n_windows)
    present = time_in_windows(arrival, departure, base_ns, window_ns, n_windows)
    # at least MIN_LOAD requests on average in the window, counting only the lead and tail phases
    enough = lead + tail >= MIN_LOAD * window_ns
    out: np.ndarray = enough & (tail >= TAIL_SHARE * lead) & (tail > 0) & (present > 0)
    return out
