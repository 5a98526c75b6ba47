"""Pauses without events: the silences of a process that stamps its own times (issue 26).

A trace recorded inside the processes it describes (OpenTelemetry SDKs, access logs) is stamped by
those processes' clocks: the `recorder` column of `requests` names, for every row, the process
whose clock stamped its arrival and departure — the server itself for its own requests, the
*calling* process for a CLIENT span standing for an uninstrumented callee (a database seen only
through the app's spans). A process that stops (a stop-the-world collection, SIGSTOP, a busy single
event loop) stamps nothing while it is stopped: requests that reach it wait in the socket backlog
and start no span; spans open across the stop, its CLIENT spans included, end only after it. Then
a burst: the waiting requests all start at the thaw.

So, per recorder: a **silence** is a gap between two consecutive stamps (any arrival or departure
the recorder stamped) at least `factor` times its typical gap while busy (holding a request of its
own) and at least `min_ns` long, followed by a **burst**: at least `burst_share` of the arrivals
its mean rate would bring during the gap (and at least 3) stamped within `burst_ns` (or a tenth of
the gap, if longer) after it, the gap and the burst together rarer than e^`log_p` by chance at that
rate (Poisson arrivals). One slow request of a running process is not a silence: arrivals go on
being stamped meanwhile, and none pile up at its end. A recorder whose requests come from
upstream (they have parent rows) must also have held a request of its own when the gap began: a
callee left idle while its caller was stopped, then hit by the caller's backlog, was not paused.
Nor was a caller whose threads all waited on a callee that had stopped answering: it went on
sending calls (at least 2 open, none ending for 10 times its median call) before falling silent.

A callee seen only through a recorder's CLIENT spans (an uninstrumented database) stamps nothing
itself, but when it **stops** (`callee_stops`) its caller's stamps show it: the calls open to it
stop ending while the caller goes on stamping (it takes requests, sends calls), then the held calls
all end at once. So, per (recorder, callee server): a gap between consecutive call ends at least
`factor` times the typical one while calls were open (and at least `min_ns`), with at least
STUCK_HELD calls open across it, the recorder stamping something inside it (it ran: not its own
silence, which its own pause or a busy single thread would give), followed by at least STUCK_HELD
call ends within half the gap after it (a server thawed with a backlog drains it over
a while), the gap and the burst together rarer than e^`log_p` by chance
at the callee's mean rate of ends. One slow call is not a stop (the others go on ending); a callee
saturated on its CPU or a lock keeps ending calls one after another.

What the silences (and known pause events of a recorder) change (`charge_recorder_pauses`):

* they are pauses of the recorder's server: a stopped server holding requests has zero capacity,
  which the fine-grained analysis counts as saturated time (`events` kind ``silence``);
* a row the recorder stamped for another server (its callee) and whose departure falls inside one
  of its pauses (or within the burst after it) ends, as far as the callee is concerned, when the
  pause began: the callee cannot have held it longer than that on the evidence, and a paused caller
  must not make its callee look slow. Its departure is moved to the pause's start (never before its
  arrival);
* a request of the recorder's own first stamped in the burst after a pause waited in its backlog:
  its arrival is moved to the pause's start (never before its parent's arrival), so the caller
  upstream does not seem to hold it.

A callee's stops are pauses of that callee (events of kind ``silence`` whose host is its server);
its calls are not moved: it held them.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tierscope.tables import conform

from .pauses import PAUSE_KINDS
from .windows import parent_rows

#: A silence is at least this many times the recorder's typical gap between stamps while busy...
FACTOR = 20.0
#: ...and at least this long (ns).
MIN_NS = 20_000_000
#: The burst after a silence: arrivals stamped within this long (ns) after it, or a tenth of it...
BURST_NS = 5_000_000
#: ...at least this share of those the recorder's mean arrival rate brings during the silence.
BURST_SHARE = 0.25
#: ...and the silence and the burst together are rarer than e^LOG_P at the mean arrival rate. A
#: trace has at most a few hundred gaps this long, and a verdict needs several pauses (fine.PAUSES_SEEN).
#: Counted once (a probe, not a bench) on the diagnosis corpus' 8 app-pause cases (104 pauses) and its 36 others: 1e-6 finds
#: 57 pauses, 1e-5 75, 1e-4 92 (an app at 23 requests/s frozen 100-150 ms has 3 arrivals at the
#: thaw: e^-10 by chance); silences where the app never paused: none, at most 1, at most 3 a case;
#: and 1e-4 found one in the independent simulator's saturated database (tests/test_analysis_inprocess.py)
LOG_P = math.log(1e-5)
#: A silence is the recorder waiting on its callee, not its pause, when at least STUCK_HELD of its
#: calls were open as it fell silent and none had ended for STUCK_FACTOR times its median call
#: (and at least STUCK_MIN_NS): the callee had stopped answering first.
STUCK_HELD = 2
STUCK_FACTOR = 10.0
STUCK_MIN_NS = 5_000_000
#: The event kind of a silence in the `events` table (one of `pauses.PAUSE_KINDS`).
KIND = "silence"
#: The burst after a pause: the requests held during it, released at once, keep the paused process
#: (and what it calls) busy for up to this long (ns) after its end. A gap in a callee's answers
#: that begins within it is the caller working off its backlog, not the callee's stop.
BURST_AFTER_NS = 500_000_000


def _own_and_observed(requests: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(recorder codes, own-row mask, recorder names) or None when no row names a recorder."""
    if "recorder" not in requests.column_names or requests.column("recorder").null_count == requests.num_rows:
        return None
    enc = requests.column("recorder").combine_chunks().dictionary_encode()
    codes = np.asarray(enc.indices.fill_null(-1), np.int64)
    names = enc.dictionary.to_pylist()
    server = requests.column("server").to_numpy(zero_copy_only=False)
    recorder = requests.column("recorder").to_numpy(zero_copy_only=False)
    own = (codes >= 0) & (server == recorder)
    return codes, own, names


def _log_tail(count: int, mean: float) -> float:
    """log P(N >= count) for N ~ Poisson(mean)."""
    if count <= 0:
        return 0.0
    if mean <= 0:
        return -math.inf
    # log of sum_{k >= count} e^-mean mean^k / k!, from its largest terms on
    terms = [k * math.log(mean) - mean - math.lgamma(k + 1) for k in range(count, count + 200)]
    top = max(terms)
    return top + math.log(sum(math.exp(t - top) for t in terms))


def recorder_silences(
    requests: pa.Table,
    factor: float = FACTOR,
    min_ns: int = MIN_NS,
    burst_ns: int = BURST_NS,
    burst_share: float = BURST_SHARE,
    log_p: float = LOG_P,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per recorder: its silences as sorted (start_ns, end_ns) epoch arrays (module docstring)."""
    found = _own_and_observed(requests)
    if found is None:
        return {}
    codes, own, names = found
    arrival = np.asarray(requests.column("arrival_ns"), np.int64)
    departure = np.asarray(requests.column("departure_ns"), np.int64)
    parents: np.ndarray | None = None  # the links, looked up only when a silence needs them
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for code, name in enumerate(names):
        mine = codes == code
        mine_own = mine & own
        if mine_own.sum() < 2:
            continue
        stamps = np.unique(np.concatenate([arrival[mine], departure[mine]]))
        if stamps.size < 3:
            continue
        ups = np.sort(arrival[mine_own])
        downs = np.sort(departure[mine_own])
        # requests of its own held just after each stamp
        held = np.searchsorted(ups, stamps, "right") - np.searchsorted(downs, stamps, "right")
        gap = np.diff(stamps)
        busy = held[:-1] >= 1
        if not busy.any():
            continue
        typical = float(np.median(gap[busy]))
        idx = np.flatnonzero(gap >= max(factor * typical, float(min_ns)))
        if idx.size == 0:
            continue
        span = float(stamps[-1] - stamps[0])
        rate = ups.size / span if span > 0 else 0.0  # own arrivals per ns
        start, end = stamps[idx], stamps[idx + 1]
        window = np.maximum(burst_ns, (end - start) // 10)
        burst = np.searchsorted(ups, end + window, "right") - np.searchsorted(ups, end, "left")
        # a silence that began with no request of its own held is a pause only where nobody upstream
        # could have held back the burst: the recorder is a front (its requests have no parent row)
        front: bool | None = None
        calls = mine & ~own  # what it stamped for its callees
        call_start, call_end = arrival[calls], departure[calls]
        ends_sorted = np.sort(call_end)
        stuck_ns = (
            max(STUCK_FACTOR * float(np.median(call_end - call_start)), float(STUCK_MIN_NS)) if calls.any() else 0.0
        )
        keep = np.zeros(idx.size, bool)
        for j in range(idx.size):
            length = float(end[j] - start[j])
            if burst[j] < max(3.0, burst_share * rate * length):
                continue
            if calls.any() and _waiting_on_callee(call_start, call_end, ends_sorted, int(start[j]), stuck_ns):
                continue
            if held[idx[j]] < 1:
                if front is None:
                    parents = parent_rows(requests) if parents is None else parents
                    front = not bool((parents[mine_own] >= 0).any())
                if not front:
                    continue
            # no arrival stamped for `length`, then `burst` of them at once: by chance, at the
            # recorder's mean rate, this is rarer than e^log_p
            chance = -rate * length + _log_tail(int(burst[j]), rate * float(window[j]))
            keep[j] = chance <= log_p
        if keep.any():
            out[name] = (start[keep], end[keep])
    return out


def _waiting_on_callee(
    call_start: np.ndarray, call_end: np.ndarray, ends_sorted: np.ndarray, at: int, stuck_ns: float
) -> bool:
    """Whether, when the recorder fell silent (`at`), its callee had stopped answering: at least
    STUCK_HELD of its calls open, and none of them ending since the oldest was sent, for at least
    `stuck_ns`. A process whose threads all wait on a stopped callee stamps nothing either (no
    thread takes new requests), but it went on sending calls into the void before: it waited, it
    was not paused."""
    open_ = (call_start < at) & (call_end > at)
    if int(open_.sum()) < STUCK_HELD:
        return False
    oldest = int(call_start[open_].min())
    if at - oldest < stuck_ns:
        return False
    # no call of the recorder ended between the oldest open call's start and the silence
    k = np.searchsorted(ends_sorted, oldest, "right")
    return not (k < ends_sorted.size and ends_sorted[k] <= at)


def callee_stops(
    requests: pa.Table,
    factor: float = FACTOR,
    min_ns: int = MIN_NS,
    burst_ns: int = BURST_NS,
    log_p: float = LOG_P,
    recorder_silent: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
    recorder_busy: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per callee server seen only through a recorder's calls (an uninstrumented database behind the
    app's CLIENT spans): its stops as sorted (start_ns, end_ns) epoch arrays (module docstring),
    judged from that recorder's stamps: it ran while the calls hung.
    `recorder_silent`: the recorders' own pauses (default: their silences, found here); a gap in
    call ends during one of them or within BURST_AFTER_NS after it is the recorder's (its pause,
    then its backlog), not the callee's; `recorder_busy`: the recorders' busy silences
    (`busy.busy_silences`), a gap half covered by which is the recorder running other code before it
    took the replies (a thaw's backlog), not the callee's stop."""
    arrival = np.asarray(requests.column("arrival_ns"), np.int64)
    departure = np.asarray(requests.column("departure_ns"), np.int64)
    server = requests.column("server").to_numpy(zero_copy_only=False)
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    found = _own_and_observed(requests)
    if found is None:
        return {}
    codes, own, names = found
    silent = recorder_silences(requests) if recorder_silent is None else recorder_silent
    recorded = set(np.unique(server[own]).tolist())  # servers that stamp their own times
    out: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}

    for code, name in enumerate(names):
        mine = codes == code
        stamps = np.unique(np.concatenate([arrival[mine], departure[mine]]))
        quiet = _merged(*silent.get(name, empty))
        busy_gaps = _merged(*(recorder_busy or {}).get(name, empty))
        for callee in np.unique(server[mine & ~own]).tolist():
            if callee in recorded:
                continue  # it stamps its own: its silences are found from them
            rows = mine & ~own & (server == callee)
            stops = _stops(
                arrival[rows], departure[rows], stamps, quiet, busy_gaps,
                factor=factor, min_ns=min_ns, burst_ns=burst_ns, log_p=log_p,
            )  # fmt: skip
            if stops is not None:
                out.setdefault(callee, []).append(stops)
    return {c: _merged(np.concatenate([a for a, _ in v]), np.concatenate([b for _, b in v])) for c, v in out.items()}


def _stops(
    sent: np.ndarray,
    answered: np.ndarray,
    stamps: np.ndarray,
    quiet: tuple[np.ndarray, np.ndarray],
    busy_gaps: tuple[np.ndarray, np.ndarray],
    *,
    factor: float,
    min_ns: int,
    burst_ns: int,
    log_p: float,
) -> tuple[np.ndarray, np.ndarray] | None:
    """The stops of one server from its calls (`sent`, `answered`: epoch ns) and the sorted stamps
    that show its caller or observer running (`stamps`); `quiet` and `busy_gaps`: the caller's own
    pauses and busy silences, sorted and disjoint (see `callee_stops`). None when it never stopped."""
    if sent.size < 3:
        return None
    starts, ends = np.sort(sent), np.sort(answered)
    # calls open just after each end: how many were sent and not yet answered
    held = np.searchsorted(starts, ends, "right") - np.arange(1, ends.size + 1)
    gap = np.diff(ends)
    open_gaps = held[:-1] >= 1
    if not open_gaps.any():
        return None
    typical = float(np.median(gap[open_gaps]))
    shortest = max(factor * typical, STUCK_FACTOR * float(np.median(answered - sent)), float(min_ns))
    span = float(ends[-1] - ends[0])
    rate = ends.size / span if span > 0 else 0.0  # answers per ns
    # the candidate gaps, filtered with sorted lookups (a long trace has many idle gaps)
    k = np.flatnonzero(gap >= shortest)
    a, b = ends[k], ends[k + 1]
    first_after = np.searchsorted(starts, a, "right")
    # open across the gap's end: open just after its start, or sent during it (nothing was answered
    # in between); none answered from the last answer (or the first call sent into the gap, when
    # none was open) on
    stuck = held[k] + (np.searchsorted(starts, b, "left") - first_after)
    since = np.where(held[k] >= 1, a, starts[np.minimum(first_after, starts.size - 1)])
    length = b - since
    window = np.maximum(burst_ns, length // 2)  # a stopped server drains its backlog: not at once
    burst = np.searchsorted(ends, b + window, "right") - (k + 1)
    ok = (stuck >= STUCK_HELD) & (length >= shortest) & (burst >= STUCK_HELD)
    quiet_a, quiet_b = quiet
    busy_a, busy_b = busy_gaps
    busy_sum = np.r_[0, np.cumsum(busy_b - busy_a)]
    found_a: list[int] = []
    found_b: list[int] = []
    for since_j, b_j, length_j, window_j, burst_j in zip(
        since[ok].tolist(), b[ok].tolist(), length[ok].tolist(), window[ok].tolist(), burst[ok].tolist()
    ):
        # the caller (or the observer's arrivals) ran meanwhile: no stamp-free stretch of half the gap
        inside = stamps[np.searchsorted(stamps, since_j, "right") : np.searchsorted(stamps, b_j, "left")]
        if inside.size == 0 or float(np.diff(np.r_[since_j, inside, b_j]).max()) > length_j / 2:
            continue
        if _overlaps(quiet_a, quiet_b + BURST_AFTER_NS, since_j, b_j):
            continue  # the caller's own pause, or its backlog after one
        if _covered(busy_a, busy_b, busy_sum, since_j, b_j) >= length_j / 2:
            continue  # the caller was running other code: the replies waited for it
        chance = -rate * length_j + _log_tail(burst_j, rate * float(window_j))
        if chance > log_p:
            continue
        if found_b and since_j <= found_b[-1] + max(burst_ns, (found_b[-1] - found_a[-1]) // 2):
            found_b[-1] = b_j  # a gap while it drained the backlog of the stop before: that stop
        else:
            found_a.append(since_j)
            found_b.append(b_j)
    if not found_a:
        return None
    return np.asarray(found_a, np.int64), np.asarray(found_b, np.int64)


def _overlaps(start: np.ndarray, end: np.ndarray, a: int, b: int) -> bool:
    """Whether [a, b) meets one of the sorted, disjoint intervals [start, end) (ends sorted too)."""
    i = int(np.searchsorted(end, a, "right"))  # the first interval ending after a
    return i < start.size and int(start[i]) < b


def _covered(start: np.ndarray, end: np.ndarray, cumulative: np.ndarray, a: int, b: int) -> float:
    """How much of [a, b) the sorted, disjoint intervals [start, end) cover (`cumulative`: the running
    sum of their lengths, from 0)."""
    if start.size == 0:
        return 0.0
    i = int(np.searchsorted(end, a, "right"))  # first ending after a
    j = int(np.searchsorted(start, b, "left"))  # first starting at or after b
    if j <= i:
        return 0.0
    total = float(cumulative[j] - cumulative[i])
    total -= max(0, a - int(start[i]))  # the first one's part before a
    total -= max(0, int(end[j - 1]) - b)  # the last one's part after b
    return max(total, 0.0)


def silence_events(silences: dict[str, tuple[np.ndarray, np.ndarray]]) -> pa.Table:
    """The silences as an `events` table (kind ``silence``, host = the recorder)."""
    hosts = [h for h, (a, _) in silences.items() for _ in range(a.size)]
    start = np.concatenate([a for a, _ in silences.values()]) if silences else np.zeros(0, np.int64)
    end = np.concatenate([b for _, b in silences.values()]) if silences else np.zeros(0, np.int64)
    return conform(
        pa.table(
            {
                "start_ns": pa.array(start, pa.int64()),
                "end_ns": pa.array(end, pa.int64()),
                "host": pa.array(hosts, pa.string()),
                "kind": pa.array([KIND] * len(hosts), pa.string()),
                "detail": pa.array(["no stamp while holding requests, then a burst"] * len(hosts), pa.string()),
            }
        ),
        "events",
    )


def _merged(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(start, kind="stable")
    start, end = start[order], np.maximum.accumulate(end[order])
    if start.size == 0:
        return start, end
    new = np.r_[True, start[1:] > end[:-1]]
    first = np.flatnonzero(new)
    return start[first], np.maximum.reduceat(end, first)


def charge_recorder_pauses(
    requests: pa.Table,
    events: pa.Table | None,
    burst_ns: int = BURST_NS,
    busy: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
) -> tuple[pa.Table, pa.Table | None, int]:
    """The requests with the pauses of their recorders charged to the recorders (module docstring),
    the events with the silences and the stops of callees seen only through them added (kind
    ``silence``), and how many rows were moved. `busy`: the recorders' busy silences.

    A recorder's pauses are its silences and the pause events whose host names it."""
    found = _own_and_observed(requests)
    if found is None:
        return requests, events, 0
    silences = recorder_silences(requests)
    # a recorder's pauses: its silences and the pause events that name it
    paused = dict(silences)
    if events is not None and events.num_rows:
        known = events.filter(pc.is_in(events.column("kind"), value_set=pa.array(PAUSE_KINDS)))
        e_host = known.column("host").to_numpy(zero_copy_only=False)
        e_start, e_end = np.asarray(known.column("start_ns"), np.int64), np.asarray(known.column("end_ns"), np.int64)
        for name in found[2]:
            sel = e_host == name
            if sel.any():
                a0, b0 = paused.get(name, (np.zeros(0, np.int64), np.zeros(0, np.int64)))
                paused[name] = _merged(np.r_[a0, e_start[sel]], np.r_[b0, e_end[sel]])
    stops = callee_stops(requests, recorder_silent=paused, recorder_busy=busy)
    found_all = {**silences, **stops}
    extra = silence_events(found_all) if found_all else None
    merged = events
    if extra is not None:
        merged = (
            extra if events is None or events.num_rows == 0 else pa.concat_tables([conform(events, "events"), extra])
        )
    if merged is None or merged.num_rows == 0:
        return requests, merged, 0
    pauses = merged.filter(pc.is_in(merged.column("kind"), value_set=pa.array(PAUSE_KINDS)))
    codes, own, names = found
    arrival = np.asarray(requests.column("arrival_ns"), np.int64).copy()
    departure = np.asarray(requests.column("departure_ns"), np.int64).copy()
    hosts = pauses.column("host").to_numpy(zero_copy_only=False)
    p_start = np.asarray(pauses.column("start_ns"), np.int64)
    p_end = np.asarray(pauses.column("end_ns"), np.int64)
    moved_dep = np.zeros(requests.num_rows, bool)
    moved_arr = np.zeros(requests.num_rows, bool)
    for code, name in enumerate(names):
        sel = hosts == name
        if not sel.any():
            continue
        a, b = _merged(p_start[sel], p_end[sel])
        reach = b + np.maximum(burst_ns, (b - a) // 10)
        # calls it stamped for a callee, ending in a pause or in the burst after it
        rows = np.flatnonzero((codes == code) & ~own)
        k = np.searchsorted(a, departure[rows], "left") - 1  # the last pause starting before
        hit = (k >= 0) & (departure[rows] <= reach[np.maximum(k, 0)])
        rows, k = rows[hit], k[hit]
        new = np.maximum(arrival[rows], a[k])
        moved_dep[rows[new < departure[rows]]] = True
        departure[rows] = np.minimum(departure[rows], new)
        # its own requests first stamped in the burst after a pause: they waited in its backlog
        rows = np.flatnonzero((codes == code) & own)
        k = np.searchsorted(a, arrival[rows], "left") - 1
        hit = (k >= 0) & (arrival[rows] >= b[np.maximum(k, 0)]) & (arrival[rows] <= reach[np.maximum(k, 0)])
        rows, k = rows[hit], k[hit]
        moved_arr[rows] = True
        arrival[rows] = a[k]
    if not moved_dep.any() and not moved_arr.any():
        return requests, merged, 0
    if moved_arr.any():
        # not before the request that sent it arrived at its caller
        parent = parent_rows(requests)
        up = moved_arr & (parent >= 0)
        arrival[up] = np.maximum(arrival[up], arrival[parent[up]])
    out = requests
    for column, values in (("arrival_ns", arrival), ("departure_ns", departure)):
        i = out.schema.get_field_index(column)
        out = out.set_column(i, out.schema.field(i), pa.array(values, pa.int64()))
    return out, merged, int(moved_dep.sum() + moved_arr.sum())
