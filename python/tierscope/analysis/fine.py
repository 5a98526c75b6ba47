"""Fine-grained bottleneck analysis in one call: windows, N*, saturated windows, alternation, pauses.

    from tierscope.analysis.fine import analyze_fine
    fg = analyze_fine(requests, events)          # pyarrow tables (tierscope.tables schemas)
    print(fg.verdict.text, fg.verdict.confidence)

Per server: load and throughput per window (`windows.window_series`); when parent/child links
exist, the *exclusive* load (time waiting on downstream calls removed) is the load that decides
saturation, because a synchronous caller's inclusive load rises whenever its callee is slow. N*
per server (`saturation.saturation_point`, windows touched by a pause excluded from the fit); a
window is saturated when, for at least half of the window, the number of requests in the server
(exclusive when links exist) exceeded N* or the server was paused while holding a request (zero
capacity: `share_above_n_star`, `share_paused_busy`, their union >= 0.5) — the window's mean
load exceeding N* would also flag windows in which a saturation only began or ended. A tier is
saturated in a window when at least half of its servers are. A row's parent is the row whose
`request_id` its `parent_id` names (ids are unique once linked: `tierscope.trace.link`). Then
pairs, switches and the verdict (`alternation`), and pauses vs load.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tierscope.contracts import DEFAULT_WINDOW_NS

from . import after_calls, alternation, busy, pauses, saturation, silences, stalls
from .alternation import Verdict
from .saturation import NStar
from .windows import (
    arrival_levels,
    floor_base,
    overlaps_pause,
    parent_rows,
    request_intervals,
    service_when_idle,
    share_above,
    window_series,
)

#: Requests that found their server idle needed to take the main sequence's slope from them.
MIN_IDLE_ARRIVALS = 50

#: A window is saturated when the server's load exceeded N* for at least this share of it.
SATURATED_SHARE = 0.5


@dataclass
class FineGrained:
    """The result of `analyze_fine`."""

    # per (tier, server, window): load, load_max, throughput, throughput_normalised, load_exclusive,
    # pause_ratio, share_above_n_star, saturated. N* and `saturated` refer to `load_exclusive`
    # (= load without parent/child links): plot the main sequence against that column.
    series: pa.Table
    n_star: dict[str, NStar]  # per server
    episodes: pa.Table  # tier, server, start_ns, end_ns, duration_ns
    saturated_share: dict[str, float]  # per tier: share of windows in which the tier is saturated
    pairs: pa.Table  # tier_a, tier_b, corr_inclusive, corr_exclusive, a_without_b_share, ...
    switches_per_s: float
    pauses: pa.Table  # tier, server, host, paused_share, paused_windows, corr_load_vs_pause_ratio
    verdict: Verdict
    window_ns: int = DEFAULT_WINDOW_NS
    base_ns: int = 0
    n_windows: int = 0
    exclusive: bool = False  # whether the saturation decisions used exclusive load
    tiers: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was skipped or could not be matched
    events: pa.Table | None = None  # the events analysed: those given plus the recorders' silences

    def tier_saturated(self) -> dict[str, np.ndarray]:
        """Per tier: bool per window, saturated when at least half of its servers are."""
        return _tier_saturated(self.series, self.tiers, self.n_windows)


#: A server without N* whose median window load (exclusive) is at least this held a real queue:
#: "no saturated tier" cannot be said with confidence while it is unexplained.
UNEXPLAINED_LOAD = 2.0

#: Windows a first-pass stall covers this much of are left out of the main sequence, as paused ones are.
STALL_EXCLUDE = 0.2


def _merge_spans(
    a: dict[int, tuple[np.ndarray, np.ndarray]], b: dict[int, tuple[np.ndarray, np.ndarray]]
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per server code: the union of two sets of (start, end) spans, merged and sorted."""
    out = {}
    for key in set(a) | set(b):
        starts = np.concatenate([x[key][0] for x in (a, b) if key in x]).astype(np.int64)
        ends = np.concatenate([x[key][1] for x in (a, b) if key in x]).astype(np.int64)
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
        running = np.maximum.accumulate(ends)
        new = np.r_[True, starts[1:] > running[:-1]]
        first = np.flatnonzero(new)
        out[key] = (starts[first], np.maximum.reduceat(ends, first))
    return out


def _signature(
    parts: list[Any], server: int, level: np.ndarray, own_ns: np.ndarray, keep: np.ndarray
) -> saturation.QueueSignature:
    """The queue signature of one server, from its requests away from the trace's edges (requests
    in progress when the trace starts or ends are missing from it, so those near the edges found
    fewer others than there were) and not overlapping a known pause."""
    req = parts[0]
    mine = req.server == server
    if mine.sum() < 2:
        return saturation.queue_signature(np.zeros(0), np.zeros(0), 0.0)
    start, end = req.start[mine], req.end[mine]
    margin = float(np.quantile(end - start, 0.99))
    span = float(end.max() - start.min())
    throughput = mine.sum() / (span / 1e9) if span > 0 else 0.0
    inside = mine & keep & (req.start >= start.min() + margin) & (req.start <= end.max() - margin)
    return saturation.queue_signature(level[inside], own_ns[inside] / 1e9, throughput)


#: A server is pinned at a ceiling when its largest number of requests is the same in this share of
#: the windows in which it held any (and it held some in that share of all windows).
CEILING_SHARE = 0.9


#: The confidence factor of a verdict naming a server saturated at a ceiling: a pool's size is a
#: limit of the configuration, not the server's capacity (its N* is unknown): at most "low".
CEILING_WEIGHT = 0.45

#: A server pinned at a ceiling whose calls arriving there take less than this many times as long
#: as those that found it idle is not congested: no queue forms at it, its callers' pool is full.
UNCONGESTED_RATIO = 1.5
#: ...judged on at least this many calls at the ceiling, and at least MIN_LABEL_CALLS that found it
#: idle (per statement: at least MIN_LABEL_CALLS of each kind). A full pool leaves the server idle
#: rarely (a pool of 2 always busy: 5 idle calls in 1,400), so the comparison is of medians, which
#: a few idle calls already place (a congested server at a ceiling of k multiplies its calls'
#: times by about k: 2x at a pool of 2, where the medians of the corpus's pools gave 0.7-1.2x).
MIN_CONGESTION_CALLS = 20
MIN_LABEL_CALLS = 5
#: A verdict naming a caller's full pool (the callee held its ceiling, no slower than idle) is said
#: with at most this: the pool is inferred from the callee's ceiling, not seen. Its caller's
#: saturation is that pool's queue, so the caller's own N* (often "low": a server never idle whose
#: requests wait on something unseen, the pool) does not lower it further. On the diagnosis corpus
#: the rule named the pool in 16 verdicts (4 cases of a pool of 2, Flask and Express, 4 forms
#: each), every one right, and in no other case (docs/diagnosis.md).
POOL_CONFIDENCE = 0.85


def _uncongested(
    level: np.ndarray, own: np.ndarray, mine: np.ndarray, pinned: int, labels: np.ndarray | None = None
) -> float | None:
    """The ratio of the median residence of a server's calls that arrived with it at its ceiling
    (`pinned` - 1 others present, or more) to that of those that found it idle; None when either
    kind is too rare to tell. Near 1: the calls found no queue at the server even when it was full.
    With `labels` (the calls' statements), per label, weighted by the calls at the ceiling, over the
    labels with enough of both kinds: a mix whose slow statements find the server full more often
    than its fast ones is no queue."""
    full = mine & (level >= pinned - 1)
    idle = mine & (level <= 0)
    if pinned < 2 or int(full.sum()) < MIN_CONGESTION_CALLS or int(idle.sum()) < MIN_LABEL_CALLS:
        return None
    if labels is None:
        base = float(np.median(own[idle]))
        return float(np.median(own[full])) / base if base > 0 else None
    ratios, weights = [], []
    for label in np.unique(labels[full]):
        f, i = full & (labels == label), idle & (labels == label)
        if int(f.sum()) >= MIN_LABEL_CALLS and int(i.sum()) >= MIN_LABEL_CALLS and np.median(own[i]) > 0:
            ratios.append(float(np.median(own[f])) / float(np.median(own[i])))
            weights.append(float(f.sum()))
    return float(np.average(ratios, weights=weights)) if ratios else None


#: A server whose per-window maximum is not pinned (CEILING_SHARE) still has a ceiling k when it
#: held k requests or more for at least CEILING_HELD of the time it was busy, and more than k for
#: at most CEILING_SLACK of it: brief requests of other clients (a monitor's query every 100 ms)
#: lift a window's maximum above a pool's size, not its level.
CEILING_HELD = 0.75
CEILING_SLACK = 0.05


def _ceiling(peak: np.ndarray) -> int | None:
    """The ceiling a server's per-window maximum number of requests is pinned at, or None."""
    active = peak > 0
    if peak.size == 0 or active.mean() < CEILING_SHARE:
        return None
    top = int(peak.max())
    return top if top >= 2 and (peak[active] == top).mean() >= CEILING_SHARE else None


def _held_ceiling(parts: list[Any], server: int, peak: np.ndarray, n_servers: int, window_ns: int) -> int | None:
    """The level k >= 2 a server held for CEILING_HELD of its busy windows' time, exceeding it for
    at most CEILING_SLACK, or None."""
    active = peak > 0
    if peak.size == 0 or active.mean() < CEILING_SHARE:
        return None
    # held k for 75 % of the busy windows' time means k or more in over half of them: no k above
    # the median window's maximum can pass, and each k tried costs two sweeps of the requests
    top = min(int(peak.max()) - 1, int(np.median(peak[active])))
    for k in range(top, 1, -1):
        thresholds = np.full(n_servers, math.inf)
        thresholds[server] = k - 1
        at_least = share_above(parts, thresholds, n_servers, peak.size, window_ns)[server][active]
        thresholds[server] = k
        over = share_above(parts, thresholds, n_servers, peak.size, window_ns)[server][active]
        if float(at_least.mean()) >= CEILING_HELD and float(over.mean()) <= CEILING_SLACK:
            return k
    return None


def _residence_floor(
    parts: list[Any], server: int, own_ns: np.ndarray, labels: np.ndarray, sig: saturation.QueueSignature
) -> NStar | None:
    req = parts[0]
    mine = req.server == server
    span = float(req.end[mine].max() - req.start[mine].min())
    throughput = mine.sum() / (span / 1e9) if span > 0 else 0.0
    return saturation.residence_floor(own_ns[mine] / 1e9, labels[mine], throughput, sig.level_median)


def _tier_saturated(series: pa.Table, tiers: list[str], n_windows: int) -> dict[str, np.ndarray]:
    out = {}
    tier_col = series.column("tier").to_numpy(zero_copy_only=False)
    sat = series.column("saturated").to_numpy(zero_copy_only=False)
    for t in tiers:
        rows = sat[tier_col == t].reshape(-1, n_windows)
        out[t] = rows.sum(0) >= math.ceil(rows.shape[0] / 2)
    return out


def _tier_own_after_calls(
    requests: pa.Table,
    parent_row: np.ndarray,
    series: pa.Table,
    tiers: list[str],
    base_ns: int,
    window_ns: int,
    n_windows: int,
) -> dict[str, np.ndarray]:
    """Per calling tier: bool per window, at least half of its servers waited after their last
    calls too (`after_calls.own_windows`): saturated on their own, not only queueing for a callee."""
    arrival = np.asarray(requests.column("arrival_ns"), np.int64)
    departure = np.asarray(requests.column("departure_ns"), np.int64)
    lead, tail = after_calls.lead_and_tail(arrival, departure, parent_row)
    row_server = requests.column("server").to_numpy(zero_copy_only=False)
    tier_of = series.column("tier").to_numpy(zero_copy_only=False)[::n_windows]
    server_of = series.column("server").to_numpy(zero_copy_only=False)[::n_windows]
    out = {}
    for t in tiers:
        own = []
        for s in server_of[tier_of == t]:
            mine = (row_server == s) & (tail >= 0)
            if mine.any():
                own.append(
                    after_calls.own_windows(
                        arrival[mine], departure[mine], lead[mine], tail[mine], base_ns, window_ns, n_windows
                    )
                )
        if own:
            out[t] = np.sum(own, axis=0) >= math.ceil(int((tier_of == t).sum()) / 2)
    return out


def _tier_calls(requests: pa.Table, parent_row: np.ndarray) -> set[tuple[str, str]]:
    """(caller tier, callee tier) pairs seen in the parent/child links."""
    child = np.flatnonzero(parent_row >= 0)
    tier = requests.column("tier").combine_chunks()
    pairs = pa.table({"a": tier.take(pa.array(parent_row[child])), "b": tier.take(pa.array(child))})
    pairs = pairs.group_by(["a", "b"]).aggregate([])
    return {(a, b) for a, b in zip(pairs.column("a").to_pylist(), pairs.column("b").to_pylist()) if a != b}


def _observed_only(requests: pa.Table, keys: list[tuple[str, str]]) -> list[int]:
    """Codes of the servers every row of which another process stamped (`recorder`)."""
    if "recorder" not in requests.column_names or requests.column("recorder").null_count == requests.num_rows:
        return []
    pairs = requests.select(["tier", "server", "recorder"]).group_by(["tier", "server", "recorder"]).aggregate([])
    own, seen = set(), set()
    for r in pairs.to_pylist():
        seen.add((r["tier"], r["server"]))
        if r["recorder"] is None or r["recorder"] == r["server"]:
            own.add((r["tier"], r["server"]))
    return [i for i, key in enumerate(keys) if key in seen and key not in own]


#: A callee's stall counts when its recorder stamped something else than the callee's replies this
#: long (ns, or a tenth of the stall) before the stall ended.
AWAKE_MARGIN_NS = 2_000_000


def _stalls_while_awake(
    requests: pa.Table, server: str, spans: tuple[np.ndarray, np.ndarray], base_ns: int
) -> tuple[np.ndarray, np.ndarray]:
    """The stalls (relative to `base_ns`) of a callee seen only through its callers' stamps during
    which a recorder of its calls was awake: it stamped something other than the ends of the
    callee's calls (an arrival, a call sent) inside the stall -- after its start, which is itself
    a stamp (the call that filled the callee) -- and at least AWAKE_MARGIN_NS (or a tenth of the
    stall) before its end. A busy event loop stamps nothing while it computes, then the
    replies it finds waiting: the callee looks stalled though it had answered; a process that goes
    on taking requests and sending calls while none of the callee's replies come was awake, and
    the callee held them."""
    rec = requests.column("recorder").to_numpy(zero_copy_only=False)
    srv = requests.column("server").to_numpy(zero_copy_only=False)
    recorders = set(rec[srv == server]) - {None}
    mine = np.isin(rec, list(recorders))
    arrival = np.asarray(requests.column("arrival_ns"), np.int64)
    departure = np.asarray(requests.column("departure_ns"), np.int64)
    awake = np.sort(np.concatenate([arrival[mine], departure[mine & (srv != server)]])) - base_ns
    a, b = spans
    margin = np.maximum(AWAKE_MARGIN_NS, (b - a) // 10)
    first = np.searchsorted(awake, a, "right")
    keep = (first < awake.size) & (awake[np.minimum(first, awake.size - 1)] <= b - margin)
    return a[keep], b[keep]


def _observed_by(requests: pa.Table) -> dict[str, str]:
    """Tiers whose every row was stamped by servers of one other tier (`recorder`): callee -> that
    caller tier (an uninstrumented database seen through the app's CLIENT spans)."""
    if "recorder" not in requests.column_names or requests.column("recorder").null_count == requests.num_rows:
        return {}
    pairs = requests.select(["tier", "server", "recorder"]).group_by(["tier", "server", "recorder"]).aggregate([])
    rows = pairs.to_pylist()
    tier_of_server = {r["server"]: r["tier"] for r in rows if r["recorder"] == r["server"]}
    out: dict[str, str] = {}
    for tier in {r["tier"] for r in rows}:
        callers = {tier_of_server.get(r["recorder"]) for r in rows if r["tier"] == tier}
        caller = callers.pop() if len(callers) == 1 else None
        if caller is not None and caller != tier:
            out[tier] = caller
    return out


def idle_service_times(requests: pa.Table, events: pa.Table | None = None) -> dict[str, tuple[float, int]]:
    """Per server: the mean own residence (seconds; exclusive of time downstream when links
    exist) of the requests that found it idle and met no pause, and how many there were — the
    service time S that `analyze_fine` takes the main sequence's slope from."""
    if requests.num_rows == 0:
        return {}
    base_ns = floor_base(pc.min(requests.column("arrival_ns")).as_py(), DEFAULT_WINDOW_NS)
    end_ns = int(pc.max(requests.column("departure_ns")).as_py()) + 1
    parent_row = parent_rows(requests)
    exclusive = bool((parent_row >= 0).any())
    parts, tiers, servers = request_intervals(requests, base_ns, exclusive, end_ns, parent_row)
    keys = list(zip(tiers, servers))
    spans = pauses.pause_spans_by_server(events, keys)
    pause_spans = {i: (spans[k][0] - base_ns, spans[k][1] - base_ns) for i, k in enumerate(keys) if k in spans}
    idle = service_when_idle(parts, len(keys), pause_spans)
    return {server: (mean_ns / 1e9, count) for (_, server), (mean_ns, count) in zip(keys, idle)}


def analyze_fine(
    requests: pa.Table,
    events: pa.Table | None = None,
    window_ns: int = DEFAULT_WINDOW_NS,
    service_hints: dict[str, float] | None = None,
) -> FineGrained:
    """Fine-grained analysis of a requests table (and optional events) at `window_ns` windows.

    `service_hints` (server -> seconds): service times measured elsewhere (e.g. `idle_service_times`
    of a lower workload level of the same system), used for a server whose own requests found it
    idle fewer than MIN_IDLE_ARRIVALS times — a server saturated during the whole trace."""
    notes: list[str] = []
    window_ns = int(window_ns)
    if window_ns <= 0:
        raise ValueError(f"window_ns must be a positive number of nanoseconds, got {window_ns}")
    if requests.num_rows == 0:
        raise ValueError("requests: the table is empty; nothing to analyse")
    # callees seen only through their callers' stamps, and the busy silences of those callers,
    # read from the stamps as recorded, before any pause is charged
    observed_by = _observed_by(requests)
    found_busy = busy.busy_silences(requests, parent_rows(requests)) if observed_by else {}
    # pauses of the processes that stamped the times (their silences, their pause events) are
    # theirs: a call they stamped ends, for the callee, when its caller stopped
    requests, events, moved = silences.charge_recorder_pauses(requests, events, busy=found_busy)
    if moved:
        notes.append(
            f"{moved} call(s) stamped by a caller that was paused end, for their callee, when the pause "
            "began (the caller held them, not the callee)"
        )
    arrival = requests.column("arrival_ns")
    base_ns = floor_base(pc.min(arrival).as_py(), window_ns)
    end_ns = int(pc.max(requests.column("departure_ns")).as_py()) + 1
    has_labels = "label" in requests.column_names
    series = window_series(requests, window_ns, base_ns, exclusive=False, end_ns=end_ns, normalised=has_labels)
    parent_row = parent_rows(requests)
    exclusive = bool((parent_row >= 0).any())
    if exclusive:
        excl = window_series(
            requests, window_ns, base_ns, exclusive=True, with_max=False, end_ns=end_ns, parent_row=parent_row
        )
        series = series.append_column("load_exclusive", excl.column("load"))
    else:
        notes.append("no parent/child links: saturation decided on inclusive load")
        series = series.append_column("load_exclusive", series.column("load"))

    tier_col = series.column("tier").to_numpy(zero_copy_only=False)
    server_col = series.column("server").to_numpy(zero_copy_only=False)
    keys: list[tuple[str, str]] = []
    for t, s in zip(tier_col, server_col):
        if not keys or keys[-1] != (t, s):
            keys.append((t, s))
    n_servers = len(keys)
    n_windows = series.num_rows // n_servers
    tiers = []
    for t, _ in keys:
        if t not in tiers:
            tiers.append(t)

    ratios, unmatched = pauses.pause_ratio_by_server(events, keys, base_ns, n_windows, window_ns)
    spans = pauses.pause_spans_by_server(events, keys)
    if unmatched:
        notes.append(f"pause events of hosts matching no server or tier were ignored: {', '.join(unmatched)}")
    pause_col = np.zeros(series.num_rows)
    for i, key in enumerate(keys):
        if key in ratios:
            pause_col[i * n_windows : (i + 1) * n_windows] = ratios[key]
    series = series.append_column("pause_ratio", pa.array(pause_col))

    used = np.asarray(series.column("load_exclusive" if exclusive else "load"), np.float64)
    thr = np.asarray(series.column("throughput"), np.float64)
    saturated_col = np.zeros(series.num_rows, bool)
    n_star: dict[str, NStar] = {}
    service_of: dict[int, float] = {}  # server code -> service time (s) from requests that found it idle
    typical_of: dict[int, float] = {}  # ...and their median (s)
    ep: dict[str, list[Any]] = {"tier": [], "server": [], "start_ns": [], "end_ns": []}
    starts = np.asarray(series.column("window_start_ns"), np.int64)
    load_by_key = {}
    parts, p_tiers, p_servers = request_intervals(requests, base_ns, exclusive, end_ns, parent_row)
    if list(zip(p_tiers, p_servers)) != keys:
        raise AssertionError("server order differs between series and intervals")
    pause_spans = {}
    for i, key in enumerate(keys):
        if key in spans:
            a, b = spans[key]
            pause_spans[i] = (a - base_ns, b - base_ns)
    # stalls (holding requests, completing none) are pauses the requests show: a first pass with
    # the smallest crowd (2 held) keeps them out of the service-time and main-sequence estimates
    first_stalls = stalls.stall_spans(parts, n_servers)
    halted = _merge_spans(pause_spans, first_stalls)
    stalled_first = stalls.stalled_share(first_stalls, n_servers, n_windows, window_ns)
    level, own = arrival_levels(parts, n_servers)
    labels = (
        requests.column("label").fill_null("").to_numpy(zero_copy_only=False)
        if "label" in requests.column_names
        else None
    )
    unpaused = ~overlaps_pause(parts, halted)
    for i, (_tier, server) in enumerate(keys):
        sl = slice(i * n_windows, (i + 1) * n_windows)
        idle = (parts[0].server == i) & unpaused & (level <= 0)
        count = int(idle.sum())
        service_s = float(own[idle].mean()) / 1e9 if count >= MIN_IDLE_ARRIVALS else None
        if service_s is not None:
            service_of[i] = service_s
            typical_of[i] = float(np.median(own[idle])) / 1e9
        hinted = service_s is None and bool(service_hints) and (service_hints or {}).get(server, 0) > 0
        if hinted and service_hints:
            service_s = float(service_hints[server])
        exclude = (pause_col[sl] > 0) | (stalled_first[i] >= STALL_EXCLUDE)
        ns = saturation.saturation_point(used[sl], thr[sl], exclude=exclude, service_s=service_s)
        if hinted and service_s is not None:
            ns = dataclasses.replace(
                ns,
                method=ns.method.replace(
                    "requests that found the server idle",
                    f"requests that found the server idle at a lower workload level ({service_s * 1e3:.2f} ms; "
                    f"{count} here)",
                ),
            )
        if not math.isfinite(ns.n_star) and service_s:
            mine = (parts[0].server == i) & unpaused
            k, why = saturation.residence_knee(level[mine], own[mine] / 1e9, service_s)
            if math.isfinite(k):
                ns = saturation.from_residence_knee(ns, k, why)
        if not math.isfinite(ns.n_star):
            sig = _signature(parts, i, level, own, ~overlaps_pause(parts, pause_spans))
            if sig.saturated:
                ns = saturation.from_signature(ns, sig)
            elif sig.level_low >= saturation.SIGNATURE_MIN_LEVEL and labels is not None:
                floor = _residence_floor(parts, i, own, labels, sig)
                if floor is not None:
                    ns = dataclasses.replace(
                        floor,
                        windows_used=ns.windows_used,
                        bin_load=ns.bin_load,
                        bin_throughput=ns.bin_throughput,
                        bin_count=ns.bin_count,
                    )
        n_star[server] = ns
    # a callee pinned at a ceiling no N* explains: its callers' pool (connections, threads) is full.
    # An N* below the ceiling is refuted when the calls that found the callee full took no longer
    # than those that found it idle: above its N*, requests would have queued there (a pg_sleep
    # behind a pool of 2 looks, from its throughput alone, like a server of N* 1)
    called = {b for _, b in _tier_calls(requests, parent_row)} if exclusive else set()
    pool_full: dict[int, tuple[int, float]] = {}  # callee server code -> (ceiling, residence ratio)
    if called and "load_max" in series.column_names:
        peak = np.asarray(series.column("load_max"), np.int64)
        for i, (tier, server) in enumerate(keys):
            ns = n_star[server]
            if tier not in called:
                continue
            pinned = _ceiling(peak[i * n_windows : (i + 1) * n_windows]) or _held_ceiling(
                parts, i, peak[i * n_windows : (i + 1) * n_windows], n_servers, window_ns
            )
            if pinned is not None and math.isfinite(ns.n_star) and ns.n_star >= pinned:
                continue
            if pinned is not None:
                ratio = _uncongested(level, own, (parts[0].server == i) & unpaused, pinned, labels)
                if ratio is not None and ratio < UNCONGESTED_RATIO:
                    pool_full[i] = (pinned, ratio)
                elif math.isfinite(ns.n_star):
                    continue  # its N* stands: the calls at the ceiling queued (or cannot tell)
                n_star[server] = dataclasses.replace(
                    ns,
                    n_star=float(pinned),
                    plateau_found=True,
                    basis="ceiling",
                    confidence="low",
                    method=f"ceiling: held {pinned} requests, never more, in {CEILING_SHARE:.0%} or more of the windows "
                    "with flat throughput: its callers cannot send more (their pool of connections or threads "
                    "to it is full) and queue for it; saturated when full (low confidence: a pool's size is a "
                    "limit of the configuration, not the server's capacity, which is unknown: the curve has no "
                    f"rise); the main sequence alone: {ns.method}",
                )
    # a window is saturated when the server held more than N* requests for at least half of it
    # the level is an integer: more than round(N*) requests present means some wait (at a
    # ceiling: being full is the saturation)
    thresholds = np.asarray(
        [
            (n_star[s].n_star - 1 if n_star[s].basis == "ceiling" else max(1.0, float(np.round(n_star[s].n_star))))
            if math.isfinite(n_star[s].n_star)
            else math.inf
            for _, s in keys
        ]
    )
    above = share_above(parts, thresholds, n_servers, n_windows, window_ns)
    # a server seen only through its callers' stamps (CLIENT spans) holds their calls until they
    # take the replies: where the work it completed cannot fill half of the window on one core
    # (completions x its service time), its queue above N* was its callers' delay, not its own
    # (its service time: that of the requests that found it idle)
    observed_only = _observed_only(requests, keys)
    cleared = np.zeros(above.shape, bool)  # windows whose time above N* was its callers' delay
    for i in observed_only:
        if i in service_of:
            work = thr[i * n_windows : (i + 1) * n_windows] * service_of[i]
            cleared[i] = work < SATURATED_SHARE
            above[i][cleared[i]] = 0.0
    series = series.append_column("share_above_n_star", pa.array(above.ravel()))
    # the second pass: a stall holds more requests than the server can work on (N* + 1, at least 2)
    crowd = np.where(np.isfinite(thresholds), thresholds + 1, 2).astype(np.int64)
    found_stalls = stalls.stall_spans(parts, n_servers, min_held=crowd)
    for i in observed_only:  # a callee's stall counts only where its recorder was seen awake in it
        if i in found_stalls:
            found_stalls[i] = _stalls_while_awake(requests, keys[i][1], found_stalls[i], base_ns)
            if found_stalls[i][0].size == 0:
                del found_stalls[i]
    stalled = stalls.stalled_share(found_stalls, n_servers, n_windows, window_ns)
    series = series.append_column("share_stalled", pa.array(stalled.ravel()))
    halted = _merge_spans(pause_spans, found_stalls)
    # a paused or stalled server holding a request has zero capacity: that time counts as
    # saturated too (union: halted and busy, plus above N*, minus halted and above N*)
    busy_paused = pauses.paused_share_above(parts, halted, np.zeros(n_servers), n_servers, n_windows, window_ns)
    if halted:
        both = pauses.paused_share_above(parts, halted, thresholds, n_servers, n_windows, window_ns)
        both[cleared] = 0.0  # `above` was cleared there: nothing of it to take off twice
        saturated_time = above + busy_paused - both
    else:
        saturated_time = above
    series = series.append_column("share_paused_busy", pa.array(busy_paused.ravel()))
    # a callee held at its ceiling without a queue at it (its calls no slower than when it was idle)
    # is not saturated: its callers' pool of connections to it is full, and their requests queue for
    # it in the callers: those windows are the callers'
    pool_text: dict[str, str] = {}
    if pool_full:
        saturated_time = saturated_time.copy()
        calls = _tier_calls(requests, parent_row)
        for i, (pinned, ratio) in pool_full.items():
            callee = keys[i][0]
            callers = sorted({a for a, b in calls if b == callee})
            rows = [j for j, (t, _) in enumerate(keys) if t in callers]
            if not rows:
                continue
            for j in rows:
                saturated_time[j] = np.maximum(saturated_time[j], saturated_time[i])
            saturated_time[i] = 0.0
            for c in callers:
                pool_text[c] = (
                    f"{c} (its pool of connections to {callee} was full: {callee} held {pinned} calls, never "
                    f"more, each about as long as when it was idle, {ratio:.1f}x)"
                )
    for i, (tier, server) in enumerate(keys):
        sl = slice(i * n_windows, (i + 1) * n_windows)
        sat = saturated_time[i] >= SATURATED_SHARE
        saturated_col[sl] = sat
        load_by_key[(tier, server)] = used[sl]
        a, b = saturation.episodes(sat, starts[sl], window_ns)
        ep["tier"] += [tier] * a.size
        ep["server"] += [server] * a.size
        ep["start_ns"] += a.tolist()
        ep["end_ns"] += b.tolist()
    series = series.append_column("saturated", pa.array(saturated_col))
    episodes = pa.table(
        {
            "tier": pa.array(ep["tier"], pa.string()),
            "server": pa.array(ep["server"], pa.string()),
            "start_ns": pa.array(ep["start_ns"], pa.int64()),
            "end_ns": pa.array(ep["end_ns"], pa.int64()),
            "duration_ns": pa.array(np.asarray(ep["end_ns"], np.int64) - np.asarray(ep["start_ns"], np.int64)),
        }
    )

    tier_sat = _tier_saturated(series, tiers, n_windows)
    busy_share = _busy_callers(found_busy, requests, keys, observed_by, spans)
    plain_sat = dict(tier_sat)
    busy_windows: dict[str, np.ndarray] = {}
    for callee, caller in observed_by.items():
        if busy_share.get(caller, 0.0) >= BUSY_SHARE and callee in tier_sat and caller in tier_sat:
            # the caller ran its own code while others waited, often: the calls it stamped ended
            # late whenever it was busy, so the callee's apparent saturation is the caller's
            taken = tier_sat[callee] & ~tier_sat[caller]
            busy_windows[caller] = busy_windows.get(caller, np.zeros(n_windows, bool)) | taken
            tier_sat[caller] = tier_sat[caller] | tier_sat[callee]
            tier_sat[callee] = np.zeros(n_windows, bool)
    incl = np.asarray(series.column("load"), np.float64)
    tier_incl, tier_excl = {}, {}
    for t in tiers:
        rows = tier_col == t
        tier_incl[t] = incl[rows].reshape(-1, n_windows).sum(0)
        tier_excl[t] = used[rows].reshape(-1, n_windows).sum(0)
    pairs = alternation.pair_table(tiers, tier_incl, tier_excl, tier_sat)
    switches = alternation.switches_per_second(tiers, tier_sat, window_ns)
    plain_switches = alternation.switches_per_second(tiers, plain_sat, window_ns)
    n_star_text = {}
    for t in tiers:
        values = [n_star[s] for (tt, s) in keys if tt == t]
        finite = [v.n_star for v in values if math.isfinite(v.n_star)]
        n_star_text[t] = (
            (
                "N*"
                + "/".join(
                    ("<=" if v.basis == "queue signature" else "=") + f"{v.n_star:.1f}"
                    for v in values
                    if math.isfinite(v.n_star)
                )
            )
            if finite
            else "no plateau"
        )
    weights: dict[str, float] = {}
    unexplained = []
    for i, (t, s) in enumerate(keys):
        ns = n_star[s]
        if math.isfinite(ns.n_star):
            weight = CEILING_WEIGHT if ns.basis == "ceiling" else alternation.N_STAR_WEIGHT.get(ns.confidence, 0.6)
            if t in pool_text:  # a full pool's caller: its queue is the pool's (POOL_CONFIDENCE)
                weight = 1.0
            weights[t] = min(weights.get(t, 1.0), weight)
        elif float(np.median(used[i * n_windows : (i + 1) * n_windows])) >= UNEXPLAINED_LOAD:
            unexplained.append(f"{s} (median load {float(np.median(used[i * n_windows : (i + 1) * n_windows])):.1f})")
    # servers without N* that, were their N* 1, would be saturated often enough to take part
    unknown = np.asarray([0.0 if math.isfinite(n_star[s].n_star) else 1.0 for _, s in keys])
    uncertain = []
    if (unknown > 0).any():
        crowded = share_above(parts, np.where(unknown > 0, 1.0, math.inf), n_servers, n_windows, window_ns)
        callees_of: dict[str, set[str]] = {}
        for caller, callee in _tier_calls(requests, parent_row) if exclusive else set():
            callees_of.setdefault(caller, set()).add(callee)

        def queued_downstream(i: int) -> bool:
            """A server crowded mostly (alternation.INHERITED) while a tier it calls was saturated: its
            crowd is its requests waiting on that callee (rule 2's queue amplification), not its own."""
            full = crowded[i] >= SATURATED_SHARE
            return any(
                float((full & tier_sat[b]).sum()) >= alternation.INHERITED * float(full.sum())
                for b in callees_of.get(keys[i][0], ())
                if b in tier_sat
            )

        uncertain = [
            f"{s} ({float((crowded[i] >= SATURATED_SHARE).mean()):.0%} of the windows)"
            for i, (_, s) in enumerate(keys)
            if unknown[i]
            and float((crowded[i] >= SATURATED_SHARE).mean()) >= alternation.MIN_SHARE
            and not queued_downstream(i)
        ]
    on_its_own = (
        _tier_own_after_calls(requests, parent_row, series, tiers, base_ns, window_ns, n_windows) if exclusive else None
    )
    options: dict[str, Any] = dict(
        window_ns=window_ns,
        n_star_text=n_star_text,
        calls=_tier_calls(requests, parent_row) if exclusive else None,
        n_star_weight=weights,
        unexplained=unexplained,
        uncertain=uncertain,
        observed_by=observed_by,
    )
    verdict = alternation.verdict(tiers, tier_sat, switches, own=on_its_own, **options)
    if busy_windows:  # what the busy silences changed: without them, would the verdict be another?
        plain = alternation.verdict(tiers, plain_sat, plain_switches, own=on_its_own, **options)
        if (plain.kind, sorted(plain.tiers)) != (verdict.kind, sorted(verdict.tiers)):
            verdict = _busy_words(verdict, busy_windows, busy_share, observed_by)
    unsure = {t for t, s in keys if any(x.startswith(f"{s} (") for x in unexplained + uncertain)}
    # a tier seen only through its callers' stamps whose saturated windows completed too little work
    # to fill half of them at its typical (median) service time: its saturation after a pause may
    # be its callers' delay in taking the replies of their backlog
    for i in _observed_only(requests, keys):
        t = keys[i][0]
        sat_i = saturated_col[i * n_windows : (i + 1) * n_windows]
        if i in typical_of and sat_i.any():
            work = thr[i * n_windows : (i + 1) * n_windows][sat_i] * typical_of[i]
            if float(np.median(work)) < SATURATED_SHARE:
                unsure.add(t)
    verdict = _pool_words(verdict, pool_text)
    verdict = _in_pause_words(
        verdict,
        spans,
        tier_sat,
        base_ns,
        window_ns,
        unsure,
        observed_by,
        _tier_calls(requests, parent_row) if exclusive else None,
    )
    verdict = _stalled_awake(
        verdict, requests, keys, stalled, pause_col.reshape(n_servers, n_windows), tier_sat, set(pool_text)
    )
    verdict = _stuck_callee(verdict, requests, observed_by, tier_sat, base_ns, window_ns)
    if len(tiers) == 1 and verdict.kind in ("single", "several", "alternating"):
        verdict = _one_tier_cannot_tell(verdict, tiers[0])
    return FineGrained(
        series=series,
        n_star=n_star,
        episodes=episodes,
        saturated_share={t: float(tier_sat[t].mean()) for t in tiers},
        pairs=pairs,
        switches_per_s=switches,
        pauses=pauses.pause_table(ratios, load_by_key, window_ns),
        verdict=verdict,
        window_ns=window_ns,
        base_ns=base_ns,
        n_windows=n_windows,
        exclusive=exclusive,
        tiers=tiers,
        notes=notes,
        events=events,
    )


#: A verdict naming a tier saturated mostly while its servers stalled awake is said with at most this.
STALLED_AWAKE_CAP = 0.45


def _stalled_awake(
    verdict: Verdict,
    requests: pa.Table,
    keys: list[tuple[str, str]],
    stalled: np.ndarray,
    paused: np.ndarray,
    tier_sat: dict[str, np.ndarray],
    pool_full: set[str] | frozenset[str] = frozenset(),
) -> Verdict:
    """At most STALLED_AWAKE_CAP when a tier the verdict names was saturated mostly (half of its
    saturated windows or more) while its servers, recording their own times, *stalled awake*:
    they held requests and handed none on (`stalls`) without being paused (no silence, no pause
    event): they kept stamping, so they waited on something the trace does not show (an untraced
    call such as opening a connection, a lock), whose saturation theirs may be. Not a tier in
    `pool_full`: what it waited on is known, a connection of its full pool to a callee held at
    its ceiling (the pool rule, which caps the verdict itself)."""
    if verdict.kind not in ("single", "several", "alternating") or "recorder" not in requests.column_names:
        return verdict
    pairs = requests.select(["server", "recorder"]).group_by(["server", "recorder"]).aggregate([]).to_pylist()
    self_recorded = {r["server"] for r in pairs if r["recorder"] == r["server"]}
    found = []
    for t in verdict.tiers:
        if t in pool_full:
            continue
        rows = [i for i, (tt, s) in enumerate(keys) if tt == t and s in self_recorded]
        sat = tier_sat.get(t)
        if not rows or sat is None or not sat.any():
            continue
        awake = ((stalled[rows] >= SATURATED_SHARE) & (paused[rows] == 0)).sum(0) >= math.ceil(len(rows) / 2)
        share = float((awake & sat).sum() / sat.sum())
        if share >= 0.5:
            found.append(
                f"{t} was saturated mostly ({share:.0%} of its saturated windows) while it held requests and handed "
                f"none on, yet kept stamping (not paused): it waited on something the trace does not show (an "
                f"untraced call such as opening a connection, a lock), whose saturation this may be"
            )
    if not found:
        return verdict
    return alternation.capped(verdict, STALLED_AWAKE_CAP, "; ".join(found))


def _busy_callers(
    found: dict[str, tuple[np.ndarray, np.ndarray]],
    requests: pa.Table,
    keys: list[tuple[str, str]],
    observed_by: dict[str, str],
    paused: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]],
) -> dict[str, float]:
    """Per calling tier whose callee is seen only through its stamps: the largest share of the
    trace one of its servers spent in busy silences (`found`, from `busy.busy_silences`: running
    one request's code while others waited), those that overlap a pause of that server (`paused`,
    absolute ns) left out: a stopped process runs no code."""
    callers = set(observed_by.values())
    if not callers or not found:
        return {}
    arrival = np.asarray(requests.column("arrival_ns"), np.int64)
    departure = np.asarray(requests.column("departure_ns"), np.int64)
    span = float(departure.max() - arrival.min()) or 1.0
    out: dict[str, float] = {}
    for key in keys:
        tier, server = key
        if tier in callers and server in found:
            start, end = found[server]
            if key in paused:
                p_start, p_end = paused[key]  # merged and sorted
                # the last pause beginning before each silence's end, and whether it ends after its start
                j = np.searchsorted(p_start, end, side="left") - 1
                hit = (j >= 0) & (p_end[np.maximum(j, 0)] > start)
                start, end = start[~hit], end[~hit]
            out[tier] = max(out.get(tier, 0.0), float((end - start).sum()) / span)
    return out


#: A caller whose busy silences cover at least this share of the trace stretched the calls it
#: stamped often enough that its callee's apparent saturation (seen only through those calls) is
#: taken as the caller's. Counted once on the diagnosis corpus (a one-off probe, not a bench: see busy):
#: 0.14-0.61 in its 7 cases of a CPU-bound or CPU-starved app, at most 0.04 in its 42 cases without
#: a fault in the app (the database paused, saturated or disk-bound, a full pool, no fault).
BUSY_SHARE = 0.1
#: A verdict that names a caller because of its busy silences is said with at most this: they are
#: inferred from its stamps, not its CPU.
BUSY_CAP = 0.6


def _busy_words(
    verdict: Verdict, busy_windows: dict[str, np.ndarray], busy_share: dict[str, float], observed_by: dict[str, str]
) -> Verdict:
    """A verdict naming a caller because of its busy silences (see `busy`) says so, with at most
    BUSY_CAP."""
    named = [t for t in verdict.tiers if t in busy_windows]
    if not named or verdict.kind not in ("single", "several", "alternating"):
        return verdict
    text = "; ".join(
        f"{t} ran one request's code at a time, stamping nothing else while others waited, for "
        f"{busy_share[t]:.0%} of the trace (a busy event loop, threads under one GIL or on too few cores): "
        f"the calls it stamped to {' and '.join(sorted(c for c, a in observed_by.items() if a == t))} ended late "
        f"whenever it was busy, so their saturation ({float(busy_windows[t].mean()):.0%} of the windows) is "
        f"taken as {t}'s"
        for t in named
    )
    return alternation.capped(verdict, BUSY_CAP, text)


def _pool_words(verdict: Verdict, pool_text: dict[str, str]) -> Verdict:
    """A single bottleneck at a caller whose pool of connections to its callee was full, in those
    words, with at most POOL_CONFIDENCE (the pool is inferred from the callee's ceiling)."""
    if verdict.kind != "single" or verdict.tiers[0] not in pool_text:
        return verdict
    t = verdict.tiers[0]
    return dataclasses.replace(
        verdict,
        text=f"single bottleneck at {pool_text[t]}",
        confidence=min(verdict.confidence, POOL_CONFIDENCE),
        evidence=verdict.evidence + f"; {pool_text[t]}",
    )


#: A call held this many times the callee's median call is stuck...
STUCK_CALL_FACTOR = 10.0
#: ...and a verdict naming only its caller, saturated mostly while a call to it was stuck, is said
#: with at most this.
STUCK_CALLEE_CAP = 0.45


def _stuck_callee(
    verdict: Verdict,
    requests: pa.Table,
    observed_by: dict[str, str],
    tier_sat: dict[str, np.ndarray],
    base_ns: int,
    window_ns: int,
) -> Verdict:
    """At most STUCK_CALLEE_CAP when the verdict names a caller but not its callee seen only
    through its stamps, and the caller was saturated mostly (half of its saturated windows or more)
    while a call to that callee was stuck (open STUCK_CALL_FACTOR times the callee's median call or
    longer): the caller's requests may have been waiting on the same callee through calls it does
    not trace (opening a connection to a stopped database), its saturation the callee's."""
    if verdict.kind not in ("single", "several") or not observed_by:
        return verdict
    tier = requests.column("tier").to_numpy(zero_copy_only=False)
    arrival = np.asarray(requests.column("arrival_ns"), np.int64)
    departure = np.asarray(requests.column("departure_ns"), np.int64)
    found = []
    for callee, caller in sorted(observed_by.items()):
        if caller not in verdict.tiers or callee in verdict.tiers or not tier_sat[caller].any():
            continue
        rows = tier == callee
        length = departure[rows] - arrival[rows]
        if length.size == 0:
            continue
        stuck = length >= STUCK_CALL_FACTOR * max(float(np.median(length)), 1.0)
        sat = tier_sat[caller]
        marked = np.zeros(sat.size, bool)
        for a, b in zip(arrival[rows][stuck] - base_ns, departure[rows][stuck] - base_ns):
            marked[max(0, int(a // window_ns)) : min(sat.size, int((b - 1) // window_ns) + 1)] = True
        share = float((marked & sat).sum() / sat.sum())
        if share >= 0.5:
            found.append(
                f"{caller} was saturated mostly ({share:.0%} of its saturated windows) while a call to {callee} "
                f"(seen only through {caller}'s stamps) was stuck ({STUCK_CALL_FACTOR:g} times its median call or "
                f"longer): {caller}'s requests may have waited on {callee} through what it does not trace "
                "(opening a connection), and the saturation be that of " + callee
            )
    if not found:
        return verdict
    return alternation.capped(verdict, STUCK_CALLEE_CAP, "; ".join(found))


#: The most confidence a verdict naming the only tier of a trace can have.
ONE_TIER_CAP = 0.45


def _one_tier_cannot_tell(verdict: Verdict, tier: str) -> Verdict:
    """A trace of one tier (an access log alone, one service's spans) cannot say whether a saturation
    is that tier's own or that of anything behind it: its times include the calls it made. At most
    ONE_TIER_CAP ("low"), and why."""
    why = (
        f"the trace holds one tier only ({tier}), whose times include everything behind it: a saturation "
        "there may be its own or that of any tier it calls; add the traces (spans) of the tiers behind it "
        "to tell"
    )
    return alternation.capped(
        verdict, ONE_TIER_CAP, why, text=f"{verdict.text} or behind it (one tier in the trace: cannot tell which)"
    )


#: A tier saturated mostly within this long (ns) after the end of another tier's pauses is
#: "saturated by the burst after each pause" (the requests held during the pause, released at once).
BURST_AFTER_NS = silences.BURST_AFTER_NS
#: A pause-driven verdict (a tier paused at least PAUSES_SEEN times, the others saturated mostly in
#: the burst after its pauses) is said with at least this confidence: the pattern repeated itself.
PAUSE_CONFIDENCE = 0.85
PAUSES_SEEN = 5
#: ...while the verdict's evidence has none of these reservations.
_RESERVATIONS = ("near the",)


def _in_pause_words(
    verdict: Verdict,
    spans: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]],
    tier_sat: dict[str, np.ndarray],
    base_ns: int,
    window_ns: int,
    unsure_tiers: set[str] | None = None,
    observed_by: dict[str, str] | None = None,
    calls: set[tuple[str, str]] | None = None,
) -> Verdict:
    """The verdict in the seeds' words when a tier it names was paused (events or silences) in at
    least half of its saturated windows:
    "transient bottlenecks alternating between app (paused 50 times, median 170 ms) and db
    (saturated by the burst after each pause)"; "single bottleneck at app (paused ...)". When the
    pattern repeated (PAUSES_SEEN pauses, every other tier named saturated mostly right after
    them) and no tier outside the paused ones is unsure (`unsure_tiers`: tiers with a server
    without N*, or seen only through stamps that do not show enough work for their saturation),
    the confidence is at least PAUSE_CONFIDENCE (scaled by the amount of data) -- unless a tier is
    seen only through a paused tier's stamps (`observed_by`: an uninstrumented database behind the
    app's CLIENT spans): then at most PAUSED_RECORDER_CAP, as the trace cannot tell whether that
    tier was saturated by the burst after each pause (see `_blind_after_thaws`)."""
    if verdict.kind not in ("single", "alternating") or not spans:
        return verdict
    n_windows = next(iter(tier_sat.values())).size if tier_sat else 0
    end_ns = base_ns + n_windows * window_ns
    # pauses long enough to hold work (a 0 ms event is a mark, not a pause), per tier: how many,
    # how long, when they ended, which windows they touched
    paused: dict[str, tuple[int, np.ndarray]] = {}
    thaws: dict[str, list[np.ndarray]] = {}
    touched: dict[str, np.ndarray] = {}
    for (tier, _server), (a, b) in spans.items():
        inside = (b > base_ns) & (a < end_ns) & (b - a >= stalls.MIN_NS)
        if not inside.any():
            continue
        count, lengths = paused.get(tier, (0, np.zeros(0)))
        paused[tier] = (count + int(inside.sum()), np.concatenate([lengths, (b - a)[inside] / 1e6]))
        thaws.setdefault(tier, []).append(b[inside])
        mark = touched.setdefault(tier, np.zeros(n_windows, bool))
        first = np.clip((a[inside] - base_ns) // window_ns, 0, n_windows - 1)
        last = np.clip((b[inside] - 1 - base_ns) // window_ns, 0, n_windows - 1)
        for f, g in zip(first, last):
            mark[int(f) : int(g) + 1] = True
    # a tier is paused in the verdict's sense when its pauses touch at least half of its saturated
    # windows (a few short collections in a tier saturated on its own cores do not explain it)
    named = [
        t
        for t in verdict.tiers
        if t in paused and tier_sat[t].any() and float((touched[t] & tier_sat[t]).sum() / tier_sat[t].sum()) >= 0.5
    ]
    # callees seen only through the stamps of a paused tier (named or not): after its thaws. A callee
    # the verdict names, whose caller paused only a few times (fewer than PAUSES_SEEN: no pattern)
    # and which saturated mostly while that caller ran (outside its pauses and the bursts after
    # them), was seen through a running caller's stamps: not blind
    blind = {
        c: p
        for c, p in (observed_by or {}).items()
        if p in paused
        and {c, p} & set(verdict.tiers)
        and (
            c not in verdict.tiers
            or c not in tier_sat
            or paused[p][0] >= PAUSES_SEEN
            or _share_near_pauses(tier_sat[c], spans, p, base_ns, window_ns) >= BLIND_NEAR_SHARE
        )
    }
    if not named:
        return _blind_after_thaws(verdict, blind)

    def pause_text(t: str) -> str:
        count, lengths = paused[t]
        return f"{t} (paused {count} time{'s' if count != 1 else ''}, median {float(np.median(lengths)):.0f} ms)"

    # unsure tiers (servers without N*, callees seen only through stamps that do not show their
    # work) are a reservation only outside the paused tiers (a paused server's saturation is its
    # pauses', whatever its N*)
    # an unsure tier saturated mostly during the named tiers' pauses or the bursts after them (a
    # caller holding the requests a stopped callee does not answer) is explained by those pauses
    unexplained_unsure = {
        u
        for u in (unsure_tiers or set()) - set(named)
        if not (
            u in tier_sat
            and tier_sat[u].any()
            and max(_share_near_pauses(tier_sat[u], spans, t, base_ns, window_ns) for t in named) >= BLIND_NEAR_SHARE
        )
    }
    repeated = (
        all(paused[t][0] >= PAUSES_SEEN for t in named)
        and not unexplained_unsure
        and not any(r in verdict.evidence for r in _RESERVATIONS)
    )
    if verdict.kind == "single":
        (t,) = verdict.tiers
        conf = verdict.confidence
        if repeated:
            conf = max(conf, PAUSE_CONFIDENCE * alternation.data_weight(n_windows))
        return _blind_after_thaws(
            dataclasses.replace(verdict, text=f"single bottleneck at {pause_text(t)}", confidence=conf), blind
        )
    thaw = np.sort(np.concatenate([x for t in named for x in thaws[t]]))
    parts, after_shares = [], []
    for t in verdict.tiers:
        if t in named:
            parts.append(pause_text(t))
            continue
        sat = np.flatnonzero(tier_sat[t])
        if sat.size == 0:
            parts.append(t)
            continue
        at = base_ns + sat.astype(np.int64) * window_ns  # window starts
        k = np.searchsorted(thaw, at + window_ns, "right") - 1  # the last thaw before the window ends
        after = float(((k >= 0) & (at - thaw[np.maximum(k, 0)] <= BURST_AFTER_NS)).mean())
        after_shares.append(after)
        if after >= 0.5:
            parts.append(f"{t} (saturated by the burst after each pause)")
        else:
            parts.append(f"{t} (saturated in {tier_sat[t].mean():.0%} of the windows)")
    text = "transient bottlenecks alternating between " + (
        " and ".join(parts) if len(parts) <= 2 else ", ".join(parts[:-1]) + " and " + parts[-1]
    )
    conf = verdict.confidence
    evidence = verdict.evidence
    if after_shares:
        evidence += (
            f"; of the other tiers' saturated windows, {min(after_shares):.0%} or more began within "
            f"{BURST_AFTER_NS / 1e6:.0f} ms after a pause ended"
        )
    if repeated and min(after_shares, default=0.0) >= 0.5:
        conf = max(conf, PAUSE_CONFIDENCE * alternation.data_weight(n_windows))
    # the burst after a pause goes downstream (the requests held upstream of the paused tier, sent
    # on at once); a caller "saturated" after its callee's thaws is its own requests, held while
    # they waited on the paused callee, finishing together: not a load of its own
    upstream = sorted({t for t in verdict.tiers if t not in named for p in named if (t, p) in (calls or set())})
    if upstream:
        why = "; ".join(
            f"{t} calls the paused {', '.join(p for p in named if (t, p) in (calls or set()))}: its saturation "
            "after each thaw may be its own requests, held while they waited, finishing together"
            for t in upstream
        )
        conf = min(conf, UPSTREAM_BURST_CAP)
        evidence += "; " + why
    return _blind_after_thaws(dataclasses.replace(verdict, text=text, confidence=conf, evidence=evidence), blind)


#: The most confidence of an alternating pause verdict whose other tier is a caller of the paused one.
UPSTREAM_BURST_CAP = 0.6
#: A callee seen only through a paused caller's stamps is blind (`_blind_after_thaws`) when at least
#: this share of its saturated windows touch one of the caller's pauses or the BURST_AFTER_NS after it.
BLIND_NEAR_SHARE = 0.5


def _share_near_pauses(
    sat: np.ndarray,
    spans: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]],
    tier: str,
    base_ns: int,
    window_ns: int,
) -> float:
    """The share of the saturated windows `sat` that touch a pause of `tier` or the BURST_AFTER_NS
    after its end (1.0 when none is saturated: nothing shows the callee apart from the pauses)."""
    windows = np.flatnonzero(sat)
    if windows.size == 0:
        return 1.0
    near = np.zeros(sat.size, bool)
    for (t, _server), (a, b) in spans.items():
        if t != tier:
            continue
        first = np.clip((a - base_ns) // window_ns, 0, sat.size - 1)
        last = np.clip((b + BURST_AFTER_NS - 1 - base_ns) // window_ns, -1, sat.size - 1)
        for f, g in zip(first, last):
            if g >= f:
                near[int(f) : int(g) + 1] = True
    return float(near[windows].mean())


#: The most confidence of a pause verdict when a tier is seen only through the paused tier's stamps.
PAUSED_RECORDER_CAP = 0.45


def _blind_after_thaws(verdict: Verdict, blind: dict[str, str]) -> Verdict:
    """At most PAUSED_RECORDER_CAP when a tier (`blind`: callee -> the paused tier that stamped all
    of its calls) is seen only through a paused tier's stamps. After each thaw the paused tier takes
    up its backlog: the calls it makes then end when it gets round to their replies, so its callee
    looks saturated whether it was (the burst) or not (the caller busy), and a callee saturated by
    the burst may not show either (work the caller does not trace: opening connections). Whether
    the bottleneck alternated after each pause, the trace cannot tell; the callee's own traces or
    fine-grained resources would."""
    if not blind:
        return verdict
    why = "; ".join(
        f"{callee} is seen only through the calls {caller} stamped, and {caller} was paused: after each thaw "
        f"{caller} takes up its backlog and stamps the ends of its calls when it gets round to their replies, "
        f"so whether {callee} was saturated by the burst after each pause (the bottleneck alternating) or not "
        f"(a single bottleneck at {caller}) the trace cannot tell; {callee}'s own traces or its CPU at a fine "
        "grain would"
        for callee, caller in sorted(blind.items())
    )
    return alternation.capped(verdict, PAUSED_RECORDER_CAP, why)
