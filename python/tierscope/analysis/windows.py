"""Per-server load and throughput in fixed time windows (the raw material of the main sequence).

Definitions (seed 001 §3.2; docs/analysis.md):

* A window is the half-open interval ``[base + k·W, base + (k+1)·W)`` in integer nanoseconds.
* A request is in its server during ``[arrival_ns, departure_ns)``.
* **load** of a window = time-weighted mean number of requests in the server
  = Σ overlap(request, window) / W.
* **load_max** = the largest number of requests in the server at any instant of the window.
* **overlap** (optional) = how many requests touch the window at all (the WED-Make count).
* **throughput** = completions (departures) in the window per second.
* **throughput_normalised** (optional) = Σ over completions of median_service(label) / median
  service of the server, per second: a completion of a heavy label counts more than a light one,
  so windows with a different mix compare.
* **exclusive** load: where ``parent_id`` links a request to its upstream request, the time the
  upstream request spent waiting on its downstream calls (the union of its children's intervals,
  clipped to its own) is not counted at the upstream server.

All arithmetic is integer nanoseconds relative to ``base_ns`` (a multiple of the window, so windows
of different tables line up); floating point appears only in the final division by W.

The algorithm is O(n + windows): the integral of the number-in-server over window k is
``Σ_{arrivals in k} ((k+1)W - t) - Σ_{departures in k} ((k+1)W - t) + W·(arrived before k -
departed before k)`` — a handful of ``np.bincount`` calls and one cumulative sum, no sort and no
per-window loop. ``load_max`` needs the events in time order per server and costs a sort.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tierscope.contracts import DEFAULT_WINDOW_NS

#: Columns of the table `window_series` returns (optional ones only when asked).
SERIES_COLUMNS = (
    "tier",
    "server",
    "window_start_ns",
    "load",
    "load_max",
    "overlap",
    "throughput",
    "throughput_normalised",
)


@dataclass(frozen=True)
class Intervals:
    """Intervals on a server code axis, already relative to the base (int64 ns)."""

    server: np.ndarray  # int32 code of the server
    start: np.ndarray  # int64 ns since base
    end: np.ndarray  # int64 ns since base
    sign: int = 1  # +1 for requests, -1 for time subtracted (exclusive load)
    row: np.ndarray | None = None  # for -1 parts: the request row each interval belongs to


def floor_base(min_ns: int, window_ns: int) -> int:
    """The largest multiple of `window_ns` not after `min_ns` (integer floor, exact on epoch ns)."""
    return (int(min_ns) // window_ns) * window_ns


def _check_window(window_ns: int) -> int:
    window_ns = int(window_ns)
    if window_ns <= 0:
        raise ValueError(f"window_ns must be a positive number of nanoseconds, got {window_ns}")
    return window_ns


def _dict_codes(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[str]]:
    """Dictionary codes (int64) and the dictionary of a string column, without string copies."""
    if isinstance(column, pa.ChunkedArray):
        if not pa.types.is_dictionary(column.type):
            column = pc.dictionary_encode(column)
        column = column.combine_chunks()  # unifies the chunks' dictionaries
    elif not pa.types.is_dictionary(column.type):
        column = pc.dictionary_encode(column)
    codes = column.indices.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return codes, [str(v) for v in column.dictionary.to_pylist()]


def _server_codes(requests: pa.Table) -> tuple[np.ndarray, list[str], list[str]]:
    """Integer code per row for (tier, server), and the tier and server name of each code.

    Codes are ordered by (tier, server) name so outputs are stable and readable.
    """
    tier = requests.column("tier")
    server = requests.column("server")
    if requests.num_rows == 0:
        return np.zeros(0, np.int32), [], []
    if tier.null_count or server.null_count:
        raise ValueError("requests: tier and server must not be null")
    t_codes, t_names = _dict_codes(tier)
    s_codes, s_names = _dict_codes(server)
    pair = t_codes * len(s_names) + s_codes
    present = np.flatnonzero(np.bincount(pair, minlength=len(t_names) * len(s_names)))
    named = sorted(
        ((t_names[p // len(s_names)], s_names[p % len(s_names)], p) for p in present.tolist()),
    )
    lookup = np.full(len(t_names) * len(s_names), -1, np.int32)
    for i, (_, _, p) in enumerate(named):
        lookup[p] = i
    return lookup[pair], [t for t, _, _ in named], [s for _, s, _ in named]


def _int64(table: pa.Table, name: str) -> np.ndarray:
    col = table.column(name)
    if col.null_count:
        raise ValueError(f"requests: column {name!r} has {col.null_count} null values")
    out: np.ndarray = col.to_numpy().astype(np.int64, copy=False)
    return out


def accumulate_intervals(
    parts: list[Intervals], n_servers: int, n_windows: int, window_ns: int
) -> tuple[np.ndarray, np.ndarray]:
    """Integral of the number-in-server per (server, window), and the level at each window start.

    Returns (integral_ns, level_start), both flat float64/int64 arrays of size n_servers·n_windows
    indexed server·n_windows + window. Intervals must lie inside [0, n_windows·W].
    """
    size = n_servers * n_windows
    integral = np.zeros(size, np.float64)
    counts: np.ndarray = np.zeros(size, np.int64)
    w = np.int64(window_ns)
    step = max(1 << 20, size)  # slices keep temporaries small; never smaller than the output
    for part in parts:
        for times_all, sign in ((part.start, part.sign), (part.end, -part.sign)):
            for lo in range(0, times_all.size, step):
                times = times_all[lo : lo + step]
                srv = part.server[lo : lo + step]
                k = times // w
                tail = (w - (times - k * w)).astype(np.float64)  # ((k+1)W - t), exact below 2^53
                k += srv.astype(np.int64) * n_windows
                integral += sign * np.bincount(k, weights=tail, minlength=size)
                counts += sign * np.bincount(k, minlength=size)
    counts = counts.reshape(n_servers, n_windows)
    # level at the start of window k = net arrivals in windows < k (per server)
    level_start = np.zeros_like(counts)
    np.cumsum(counts[:, :-1], axis=1, out=level_start[:, 1:])
    integral += level_start.ravel().astype(np.float64) * float(window_ns)
    return integral, level_start.ravel()


def max_in_windows(parts: list[Intervals], n_servers: int, n_windows: int, window_ns: int) -> np.ndarray:
    """Largest number-in-server at any instant of each window (flat, server·n_windows + window).

    Every interval end point becomes one int64 key ``(server·span + t)·2 + up`` where ``up`` is 1
    for an increase of the level and 0 for a decrease; one unstable sort orders the events of each
    server by time with decreases first at equal instants (intervals are half-open), the running
    level is a cumulative sum of ±1, and its maximum per window is one ``reduceat``. The level at
    the first instant of a window (for windows with no event inside) comes from per-window counts.
    """
    size = n_servers * n_windows
    w = np.int64(window_ns)
    span = np.int64(n_windows) * w + 1
    if int(span) * max(n_servers, 1) * 2 >= 2**62:
        raise ValueError("time span too long for load_max at this window; use a coarser window")
    net: np.ndarray = np.zeros(size, np.int64)  # net change of the level from events inside each window
    edge = np.zeros(size, np.int64)  # the part of it exactly on the window's left edge
    keys = []
    for part in parts:
        codes = part.server.astype(np.int64)
        for times, delta in ((part.start, part.sign), (part.end, -part.sign)):
            k = times // w
            idx = codes * n_windows + k
            net += delta * np.bincount(idx, minlength=size)
            edge += delta * np.bincount(idx[times == k * w], minlength=size)
            del k, idx
            key = codes * span
            key += times
            key *= 2
            if delta > 0:
                key += 1
            keys.append(key)
    net = net.reshape(n_servers, n_windows)
    before = np.zeros_like(net)
    np.cumsum(net[:, :-1], axis=1, out=before[:, 1:])
    out = before.ravel() + edge  # the level at instant base + k·W, after the events there
    key = np.concatenate(keys)
    del keys
    if key.size == 0:
        return out
    key.sort()
    # one server at a time keeps the temporaries small
    bounds = np.searchsorted(key, np.arange(n_servers + 1, dtype=np.int64) * span * 2)
    for srv in range(n_servers):
        chunk = key[bounds[srv] : bounds[srv + 1]]
        if chunk.size == 0:
            continue
        level = np.cumsum((chunk & 1).astype(np.int32) * 2 - 1, dtype=np.int32)
        k = ((chunk >> 1) - srv * span) // w
        starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
        peak = np.maximum.reduceat(level, starts)
        # the level carried into this server's chunk from earlier servers is zero (each sums to 0)
        cells = srv * n_windows + k[starts]
        out[cells] = np.maximum(out[cells], peak)
    return out


def share_above(
    parts: list[Intervals], thresholds: np.ndarray, n_servers: int, n_windows: int, window_ns: int
) -> np.ndarray:
    """Share of each window during which a server held more than its threshold of requests.

    `thresholds[server]` may be inf (never above). Returns shape (n_servers, n_windows). The level
    is swept in time order per server (as in `max_in_windows`); the stretches where it exceeds the
    threshold become intervals whose overlap with each window is accumulated exactly.
    """
    w = np.int64(window_ns)
    span = np.int64(n_windows) * w + 1
    keys = []
    for part in parts:
        codes = part.server.astype(np.int64)
        for times, delta in ((part.start, part.sign), (part.end, -part.sign)):
            key = codes * span
            key += times
            key *= 2
            if delta > 0:
                key += 1
            keys.append(key)
    out = np.zeros((n_servers, n_windows))
    if not keys:
        return out
    key = np.concatenate(keys)
    key.sort()
    bounds = np.searchsorted(key, np.arange(n_servers + 1, dtype=np.int64) * span * 2)
    seg_srv, seg_a, seg_b = [], [], []
    for srv in range(n_servers):
        thr = float(thresholds[srv])
        chunk = key[bounds[srv] : bounds[srv + 1]]
        if chunk.size < 2 or not np.isfinite(thr):
            continue
        level = np.cumsum((chunk & 1).astype(np.int32) * 2 - 1, dtype=np.int32)
        t = (chunk >> 1) - srv * span
        above = level[:-1] > thr
        a, b = t[:-1][above], t[1:][above]
        keep = b > a
        seg_srv.append(np.full(int(keep.sum()), srv, np.int32))
        seg_a.append(a[keep])
        seg_b.append(b[keep])
    if not seg_srv:
        return out
    part = Intervals(np.concatenate(seg_srv), np.concatenate(seg_a), np.concatenate(seg_b), +1)
    integral, _ = accumulate_intervals([part], n_servers, n_windows + 1, window_ns)
    return integral.reshape(n_servers, n_windows + 1)[:, :n_windows] / window_ns


def request_intervals(
    requests: pa.Table,
    base_ns: int,
    exclusive: bool,
    end_ns: int | None = None,
    parent_row: np.ndarray | None = None,
) -> tuple[list[Intervals], list[str], list[str]]:
    """The +1 intervals of the requests (and −1 intervals of their children when `exclusive`),
    relative to `base_ns`, with the tier and server name of each server code."""
    arrival = _int64(requests, "arrival_ns")
    departure = _int64(requests, "departure_ns")
    codes, tiers, servers = _server_codes(requests)
    base = np.int64(base_ns)
    rel_a = np.maximum(arrival - base, 0)
    rel_d = np.maximum(departure - base, 0)
    if end_ns is not None:
        limit = np.int64(end_ns) - base
        rel_a, rel_d = np.minimum(rel_a, limit), np.minimum(rel_d, limit)
    parts = [Intervals(codes, rel_a, rel_d, +1)]
    if exclusive:
        rows = parent_rows(requests) if parent_row is None else parent_row
        prow, cs, ce = exclusive_children(rows, rel_a, rel_d)
        if prow.size:
            parts.append(Intervals(codes[prow], cs, ce, -1, prow))
    return parts, tiers, servers


def arrival_levels(parts: list[Intervals], n_servers: int) -> tuple[np.ndarray, np.ndarray]:
    """Per request row of `parts[0]`: the number of other requests in its server when it arrived
    (exclusive of those waiting downstream when `parts` has children), and its own residence in ns
    (its residence minus its time downstream)."""
    req = parts[0]
    own = (req.end - req.start).astype(np.float64)
    child = parts[1] if len(parts) > 1 else None
    if child is not None and child.row is not None:
        own -= np.bincount(child.row, weights=(child.end - child.start).astype(np.float64), minlength=own.size)
    level = np.zeros(req.start.size, np.int64)
    for srv in range(n_servers):
        m = req.server == srv
        t = req.start[m]
        a, d = np.sort(t), np.sort(req.end[m])
        lv = np.searchsorted(a, t, "left") - np.searchsorted(d, t, "right")
        if child is not None:
            cm = child.server == srv
            cs, ce = np.sort(child.start[cm]), np.sort(child.end[cm])
            lv -= np.searchsorted(cs, t, "left") - np.searchsorted(ce, t, "right")
        level[m] = lv
    return level, np.maximum(own, 0.0)


def overlaps_pause(parts: list[Intervals], pauses: dict[int, tuple[np.ndarray, np.ndarray]] | None) -> np.ndarray:
    """Per request row of `parts[0]`: whether it overlapped one of its server's `pauses` (sorted
    (start, end) arrays relative to the same base)."""
    req = parts[0]
    hit = np.zeros(req.start.size, bool)
    for srv, (ps, pe) in (pauses or {}).items():
        m = np.flatnonzero(req.server == srv)
        first = np.searchsorted(pe, req.start[m], "right")  # the first pause ending after the arrival
        h = first < ps.size
        h[h] = ps[first[h]] < req.end[m][h]
        hit[m] = h
    return hit


def service_when_idle(
    parts: list[Intervals],
    n_servers: int,
    pauses: dict[int, tuple[np.ndarray, np.ndarray]] | None = None,
) -> list[tuple[float, int]]:
    """Per server code: the mean own residence (ns) of requests that arrived when no other request
    was in the server (exclusive of time downstream when `parts` has children), and their count.

    A request that finds its server empty does not queue on arrival, so its residence is its
    service time: an estimate of S free of queueing, and the slope 1/S of the main sequence.
    Requests overlapping one of the server's `pauses` (sorted (start, end) arrays relative to the
    same base) are left out: a pause, not service, made them long.
    """
    level, own = arrival_levels(parts, n_servers)
    idle = (level <= 0) & ~overlaps_pause(parts, pauses)
    out = []
    for srv in range(n_servers):
        vals = own[idle & (parts[0].server == srv)]
        out.append((float(vals.mean()) if vals.size else math.nan, int(vals.size)))
    return out


def _relative(times: np.ndarray, base: np.int64) -> np.ndarray:
    """times - base, clipped at 0, in place when the array is ours to change."""
    out = times if times.flags.writeable else np.empty_like(times)
    np.subtract(times, base, out=out)
    np.maximum(out, 0, out=out)
    return out


def _window_count(max_rel_end: int, window_ns: int) -> int:
    # Windows cover [0, max_end]; an end exactly on an edge still opens that window for bookkeeping.
    return int(max_rel_end // window_ns) + 1


def parent_rows(requests: pa.Table) -> np.ndarray:
    """For every row, the row of its parent request (parent_id = that row's request_id), or -1.

    -1 also when the parent was not observed (not in the table). Computed once per table: the
    string lookup is the expensive part of everything that uses the links.
    """
    n = requests.num_rows
    out = np.full(n, -1, np.int64)
    if not {"request_id", "parent_id"} <= set(requests.column_names) or n == 0:
        return out
    parent_id = requests.column("parent_id").combine_chunks()
    if parent_id.null_count == n:
        return out
    # skip_nulls: a row without a parent id must not match a row without a request id
    found = pc.index_in(parent_id, value_set=requests.column("request_id").combine_chunks(), skip_nulls=True)
    valid = pc.is_valid(found).to_numpy(zero_copy_only=False)
    out[valid] = found.filter(pa.array(valid)).to_numpy(zero_copy_only=False).astype(np.int64)
    return out


def exclusive_children(
    parent_row: np.ndarray, arrival: np.ndarray, departure: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The time each request spent waiting on its downstream calls, as merged intervals.

    `parent_row` is `parent_rows(requests)`. Returns (parent_row, start, end): for every parent,
    the union of its children's [arrival, departure) intervals clipped to the parent's own
    interval. Children whose parent is not in the table are ignored (their parent was not seen).
    """
    import pandas as pd

    child_rows = np.flatnonzero(parent_row >= 0)
    if child_rows.size == 0:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty
    parent_row = parent_row[child_rows]
    s = np.maximum(arrival[child_rows], arrival[parent_row])
    e = np.minimum(departure[child_rows], departure[parent_row])
    good = e > s
    parent_row, s, e = parent_row[good], s[good], e[good]
    if parent_row.size == 0:
        return parent_row, s, e
    # union of intervals per parent: sort by (parent, start); a new run starts where the start
    # passes the running maximum end of the previous intervals of the same parent
    order = np.lexsort((s, parent_row))
    parent_row, s, e = parent_row[order], s[order], e[order]
    running = pd.Series(e).groupby(parent_row).cummax().to_numpy()
    prev_max = np.r_[np.int64(-1), running[:-1]]
    new_parent = np.r_[True, parent_row[1:] != parent_row[:-1]]
    new_run = new_parent | (s > prev_max)
    first = np.flatnonzero(new_run)
    run_end = np.maximum.reduceat(e, first)
    return parent_row[first], s[first], run_end


def window_series(
    requests: pa.Table,
    window_ns: int = DEFAULT_WINDOW_NS,
    base_ns: int | None = None,
    exclusive: bool = False,
    *,
    with_max: bool = True,
    with_overlap: bool = False,
    normalised: bool = False,
    end_ns: int | None = None,
    parent_row: np.ndarray | None = None,
) -> pa.Table:
    """Per-server load and throughput in windows of `window_ns` nanoseconds.

    Returns one row per (tier, server, window) over the common time axis of all servers, with
    columns tier, server, window_start_ns (int64, epoch ns), load (float: Σ overlap / W),
    load_max (int, when `with_max`), overlap (int, when `with_overlap`), throughput
    (completions per second), throughput_normalised (when `normalised`).

    `base_ns` is the start of window 0 (default: the earliest arrival floored to a multiple of
    the window); requests before it are clipped to it. `end_ns` ends the axis (default: the last
    departure). `exclusive=True` subtracts from each request the time its children (rows whose
    parent_id is its request_id) were in progress downstream (`parent_row`: the precomputed
    `parent_rows(requests)`, to share that lookup between calls).
    """
    window_ns = _check_window(window_ns)
    for name in ("tier", "server", "arrival_ns", "departure_ns"):
        if name not in requests.column_names:
            raise ValueError(f"requests: required column {name!r} is missing")
    arrival = _int64(requests, "arrival_ns")
    departure = _int64(requests, "departure_ns")
    bad = departure < arrival
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"requests: {int(bad.sum())} rows have departure_ns < arrival_ns (first: row {i}, "
            f"arrival {arrival[i]}, departure {departure[i]})"
        )
    codes, tiers, servers = _server_codes(requests)
    if requests.num_rows == 0:
        return _empty_series(with_max, with_overlap, normalised)
    if base_ns is None:
        base_ns = floor_base(int(arrival.min()), window_ns)
    base = np.int64(base_ns)
    rel_a = _relative(arrival, base)
    rel_d = _relative(departure, base)
    del arrival, departure
    last = int(rel_d.max()) if end_ns is None else int(end_ns) - int(base_ns) - 1
    if last < 0:
        raise ValueError(f"end_ns {end_ns} is before base_ns {base_ns}")
    n_windows = _window_count(last, window_ns)
    limit = np.int64(n_windows) * np.int64(window_ns)
    if end_ns is not None:
        rel_a = np.minimum(rel_a, limit)
        rel_d = np.minimum(rel_d, limit)
    n_servers = len(tiers)
    # the upper edge of the last window is bookkept in one extra window, dropped at the end
    n_cells = n_windows + 1
    parts = [Intervals(codes, rel_a, rel_d, +1)]
    if exclusive:
        rows = parent_rows(requests) if parent_row is None else parent_row
        prow, cs, ce = exclusive_children(rows, rel_a, rel_d)
        if prow.size:
            parts.append(Intervals(codes[prow], cs, ce, -1, prow))
    integral, level_start = accumulate_intervals(parts, n_servers, n_cells, window_ns)
    integral = integral.reshape(n_servers, n_cells)[:, :n_windows]
    seconds = window_ns / 1e9
    done_idx = rel_d // np.int64(window_ns)
    done_idx += codes.astype(np.int64) * n_cells
    done = np.bincount(done_idx, minlength=n_servers * n_cells).reshape(n_servers, n_cells)
    columns: dict[str, np.ndarray] = {
        "load": (integral / window_ns).ravel(),
    }
    if with_max:
        peak = max_in_windows(parts, n_servers, n_cells, window_ns)
        columns["load_max"] = peak.reshape(n_servers, n_cells)[:, :n_windows].ravel()
    if with_overlap:
        columns["overlap"] = _overlap_count(codes, rel_a, rel_d, n_servers, n_cells, window_ns)[:, :n_windows].ravel()
    columns["throughput"] = (done[:, :n_windows] / seconds).ravel()
    if normalised:
        weights = _label_weights(requests, codes, rel_d - rel_a)
        wdone = np.bincount(done_idx, weights=weights, minlength=n_servers * n_cells)
        columns["throughput_normalised"] = (wdone.reshape(n_servers, n_cells)[:, :n_windows] / seconds).ravel()
    starts = base + np.arange(n_windows, dtype=np.int64) * np.int64(window_ns)
    tier_col = pa.DictionaryArray.from_arrays(
        np.repeat(np.arange(n_servers, dtype=np.int32), n_windows), pa.array(tiers)
    )
    server_col = pa.DictionaryArray.from_arrays(
        np.repeat(np.arange(n_servers, dtype=np.int32), n_windows), pa.array(servers)
    )
    data = {
        "tier": tier_col.cast(pa.string()),
        "server": server_col.cast(pa.string()),
        "window_start_ns": pa.array(np.tile(starts, n_servers), pa.int64()),
    }
    for name, values in columns.items():
        data[name] = pa.array(values)
    return pa.table(data)


def _overlap_count(
    codes: np.ndarray, rel_a: np.ndarray, rel_d: np.ndarray, n_servers: int, n_cells: int, w: int
) -> np.ndarray:
    """Requests touching each window: arrived before its end and departed after its start."""
    size = n_servers * n_cells
    srv = codes.astype(np.int64) * n_cells
    ka = rel_a // np.int64(w)
    # last window touched: the one containing departure - 1 ns (half-open), at least ka
    kd = np.maximum((rel_d - 1) // np.int64(w), ka)
    diff = np.bincount(srv + ka, minlength=size) - np.bincount(srv + kd + 1, minlength=size + 1)[:size]
    return np.cumsum(diff.reshape(n_servers, n_cells), axis=1)


def _label_weights(requests: pa.Table, codes: np.ndarray, service_ns: np.ndarray) -> np.ndarray:
    """Weight of each completion: median service time of its (server, label) / of its server."""
    import pandas as pd

    if "label" in requests.column_names:
        label = requests.column("label").fill_null("").to_numpy(zero_copy_only=False)
    else:
        label = np.full(requests.num_rows, "", object)
    frame = pd.DataFrame({"s": codes, "l": label, "t": service_ns.astype(np.float64)})
    per_label = frame.groupby(["s", "l"])["t"].transform("median").to_numpy()
    per_server = frame.groupby("s")["t"].transform("median").to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        weight = np.where(per_server > 0, per_label / per_server, 1.0)
    return weight


def _empty_series(with_max: bool, with_overlap: bool, normalised: bool) -> pa.Table:
    fields = [
        pa.field("tier", pa.string()),
        pa.field("server", pa.string()),
        pa.field("window_start_ns", pa.int64()),
        pa.field("load", pa.float64()),
    ]
    if with_max:
        fields.append(pa.field("load_max", pa.int64()))
    if with_overlap:
        fields.append(pa.field("overlap", pa.int64()))
    fields.append(pa.field("throughput", pa.float64()))
    if normalised:
        fields.append(pa.field("throughput_normalised", pa.float64()))
    return pa.schema(fields).empty_table()


def interval_ratio(
    start_ns: np.ndarray, end_ns: np.ndarray, base_ns: int, n_windows: int, window_ns: int
) -> np.ndarray:
    """Share of each window covered by the given intervals (summed, so overlaps add), length n_windows."""
    if start_ns.size == 0:
        return np.zeros(n_windows)
    limit = np.int64(n_windows) * np.int64(window_ns)
    s = np.clip(start_ns.astype(np.int64) - np.int64(base_ns), 0, limit)
    e = np.clip(end_ns.astype(np.int64) - np.int64(base_ns), 0, limit)
    e = np.maximum(e, s)
    part = Intervals(np.zeros(s.size, np.int32), s, e, +1)
    integral, _ = accumulate_intervals([part], 1, n_windows + 1, window_ns)
    return integral[:n_windows] / window_ns


def _parquet_bounds(pf: Any) -> tuple[int | None, int | None]:
    """min(arrival_ns), max(departure_ns) from the row groups' statistics, or None if absent."""
    meta = pf.metadata
    names = pf.schema_arrow.names
    ia, idp = names.index("arrival_ns"), names.index("departure_ns")
    lo = hi = None
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        sa, sd = rg.column(ia).statistics, rg.column(idp).statistics
        if sa is None or sd is None or not sa.has_min_max or not sd.has_min_max:
            return None, None
        lo = sa.min if lo is None else min(lo, sa.min)
        hi = sd.max if hi is None else max(hi, sd.max)
    return lo, hi


def window_series_file(
    path: str,
    window_ns: int = DEFAULT_WINDOW_NS,
    base_ns: int | None = None,
    *,
    batch_rows: int = 1 << 20,
) -> pa.Table:
    """`window_series` (load and throughput) over a requests Parquet file, in bounded memory.

    Reads the file in batches of `batch_rows` (only tier, server, arrival_ns, departure_ns, with
    the string columns as dictionaries) and adds each batch's contribution to per-(server, window)
    accumulators: the window integral is additive, so memory is O(batch + servers·windows). The
    time axis comes from the row-group statistics (or one extra pass over the two time columns).
    No load_max here: it needs a global sort (use `window_series` on a table for it).
    """
    import pyarrow.parquet as pq

    window_ns = _check_window(window_ns)
    pf = pq.ParquetFile(path, read_dictionary=["tier", "server"])
    missing = {"tier", "server", "arrival_ns", "departure_ns"} - set(pf.schema_arrow.names)
    if missing:
        raise ValueError(f"{path}: required columns missing: {sorted(missing)}")
    lo, hi = _parquet_bounds(pf)
    if lo is None:
        lo, hi = None, None
        for batch in pf.iter_batches(batch_size=batch_rows, columns=["arrival_ns", "departure_ns"]):
            mn, mx = pc.min(batch.column(0)).as_py(), pc.max(batch.column(1)).as_py()
            lo = mn if lo is None or (mn is not None and mn < lo) else lo
            hi = mx if hi is None or (mx is not None and mx > hi) else hi
    if lo is None or hi is None:
        return _empty_series(False, False, False)
    if base_ns is None:
        base_ns = floor_base(int(lo), window_ns)
    base = np.int64(base_ns)
    n_windows = _window_count(max(int(hi) - int(base_ns), 0), window_ns)
    n_cells = n_windows + 1
    w = np.int64(window_ns)
    names: dict[tuple[str, str], int] = {}
    integral = np.zeros((0, n_cells))
    counts = np.zeros((0, n_cells), np.int64)
    done = np.zeros((0, n_cells), np.int64)
    row = 0
    for batch in pf.iter_batches(batch_size=batch_rows, columns=["tier", "server", "arrival_ns", "departure_ns"]):
        t_codes, t_names = _dict_codes(batch.column(0))
        s_codes, s_names = _dict_codes(batch.column(1))
        pair = t_codes * len(s_names) + s_codes
        present = np.flatnonzero(np.bincount(pair, minlength=len(t_names) * len(s_names)))
        lookup = np.full(len(t_names) * len(s_names), -1, np.int64)
        for p in present.tolist():
            key = (t_names[p // len(s_names)], s_names[p % len(s_names)])
            lookup[p] = names.setdefault(key, len(names))
        if len(names) > integral.shape[0]:
            grow = len(names) - integral.shape[0]
            integral = np.vstack([integral, np.zeros((grow, n_cells))])
            counts = np.vstack([counts, np.zeros((grow, n_cells), np.int64)])
            done = np.vstack([done, np.zeros((grow, n_cells), np.int64)])
        srv = lookup[pair] * n_cells
        a = batch.column(2).to_numpy().astype(np.int64, copy=False) - base
        d = batch.column(3).to_numpy().astype(np.int64, copy=False) - base
        if (d < a).any():
            i = int(np.flatnonzero(d < a)[0])
            raise ValueError(f"{path}: row {row + i}: departure_ns < arrival_ns")
        np.maximum(a, 0, out=a)
        np.maximum(d, 0, out=d)
        size = integral.size
        for times, sign in ((a, 1), (d, -1)):
            k = times // w
            idx = srv + k
            tail = (w - (times - k * w)).astype(np.float64)
            integral.ravel()[:] += sign * np.bincount(idx, weights=tail, minlength=size)
            counts.ravel()[:] += sign * np.bincount(idx, minlength=size)
        done.ravel()[:] += np.bincount(srv + d // w, minlength=size)
        row += batch.num_rows
    before = np.zeros_like(counts)
    np.cumsum(counts[:, :-1], axis=1, out=before[:, 1:])
    integral += before * float(window_ns)
    order = sorted(names, key=lambda k: k)
    rows = np.asarray([names[k] for k in order], np.int64)
    n_servers = len(order)
    starts = base + np.arange(n_windows, dtype=np.int64) * w
    return pa.table(
        {
            "tier": pa.array(np.repeat([k[0] for k in order], n_windows).tolist(), pa.string()),
            "server": pa.array(np.repeat([k[1] for k in order], n_windows).tolist(), pa.string()),
            "window_start_ns": pa.array(np.tile(starts, n_servers)),
            "load": pa.array((integral[rows, :n_windows] / window_ns).ravel()),
            "throughput": pa.array((done[rows, :n_windows] / (window_ns / 1e9)).ravel()),
        }
    )


def window_series_sql(
    source: str | list[str],
    window_ns: int = DEFAULT_WINDOW_NS,
    base_ns: int | None = None,
    *,
    exclusive: bool = False,
    shared_ids: str = "error",
    connection: Any = None,
    memory_limit: str | None = None,
) -> pa.Table:
    """The same load and throughput as `window_series`, computed by DuckDB on Parquet files.

    `source`: a Parquet file, a glob, or a list of them. For inputs larger than memory: DuckDB
    streams the files and spills its aggregation to disk. The query is `sql_query` (shared with
    the Spark engine, `spark_windows.window_series_spark`); columns `SQL_SCHEMA` (with
    `load_exclusive` when `exclusive`). Windows a server never touches are absent (not
    zero-filled) in this variant. Request ids shared by several rows raise `SharedRequestIds`;
    with `shared_ids="ignore"` the links are left out instead (`load_exclusive` = `load`).
    """
    import duckdb

    window_ns = _check_window(window_ns)
    con = connection or duckdb.connect()
    if memory_limit:
        con.execute(f"SET memory_limit='{memory_limit}'")
    sources = [source] if isinstance(source, str) else list(source)
    src = "read_parquet([" + ", ".join(_sql_literal(s) for s in sources) + "])"
    columns = {c[0] for c in con.sql(f"DESCRIBE SELECT * FROM {src}").fetchall()}
    links = exclusive and {"request_id", "parent_id"} <= columns
    row = con.execute(preflight_query(src, columns, links)).fetchall()[0]
    check = preflight(row, ", ".join(sources), shared_ids=shared_ids)
    links = links and not shared_id_count(row)
    if check is None:
        return sql_empty(exclusive)
    if base_ns is None:
        base_ns = floor_base(check, window_ns)
    query = sql_query(src, window_ns, base_ns, exclusive=exclusive, links=links, dialect="duckdb")
    relation = con.sql(query)
    fetch = getattr(relation, "to_arrow_table", None) or relation.arrow
    return sql_conform(fetch(), exclusive)


def _sql_literal(text: str) -> str:
    return "'" + str(text).replace("'", "''") + "'"


# ---------------------------------------------------------------------------------------------
# The window SQL, one text for DuckDB and Spark SQL.
#
# Everything is ANSI-ish SQL both engines parse the same way: CTEs, CASE, greatest/least, `%`
# on non-negative BIGINTs, window functions with ROWS frames, CAST(... AS DOUBLE). Windows are
# keyed by their start offset from the base (`t - t % W`), so no integer division is needed
# (DuckDB spells it `//`, Spark `div`; `/` is floating point in both). The one construct the two
# dialects spell differently is "one output row per element of an integer range", kept in
# SQL_DIALECTS.

#: Per engine: how to turn one row into one row per window start in [lo, hi] (inclusive) by `step`.
SQL_DIALECTS = {
    "duckdb": "unnest(generate_series({lo}, {hi}, {step}))",
    "spark": "explode(sequence({lo}, {hi}, {step}))",
}

#: Columns (and Arrow types) of the SQL engines' window series; `load_exclusive` only when asked.
SQL_SCHEMA = pa.schema(
    [
        pa.field("tier", pa.string()),
        pa.field("server", pa.string()),
        pa.field("window_start_ns", pa.int64()),
        pa.field("load", pa.float64()),
        pa.field("load_exclusive", pa.float64()),
        pa.field("throughput", pa.float64()),
    ]
)


def sql_schema(exclusive: bool) -> pa.Schema:
    """`SQL_SCHEMA` without `load_exclusive` unless `exclusive`."""
    return SQL_SCHEMA if exclusive else SQL_SCHEMA.remove(SQL_SCHEMA.get_field_index("load_exclusive"))


def sql_empty(exclusive: bool) -> pa.Table:
    return sql_schema(exclusive).empty_table()


def sql_conform(table: pa.Table, exclusive: bool) -> pa.Table:
    """An engine's result with the columns in `SQL_SCHEMA` order and types (engines differ in string
    and integer widths), so results of different engines compare with `Table.equals`."""
    schema = sql_schema(exclusive)
    return pa.table([table.column(f.name).cast(f.type) for f in schema], schema=schema)


def preflight_query(src: str, columns: set[str], links: bool) -> str:
    """One pass over the requests that finds the base and what would make the window query wrong:
    the earliest arrival, rows with a null tier/server/time, rows departing before they arrive,
    and (with `links`) request ids carried by more than one row."""
    missing = {"tier", "server", "arrival_ns", "departure_ns"} - set(columns)
    if missing:
        raise ValueError(f"requests: required columns missing: {sorted(missing)}")
    # a grouping, not count(DISTINCT): Spark then keeps the other aggregates out of the distinct
    # plan (2-3x faster on 1 M rows) and the number counted is the ids, as the error says
    dup = (
        f"(SELECT count(*) FROM (SELECT request_id FROM {src} WHERE request_id IS NOT NULL "
        f"GROUP BY request_id HAVING count(*) > 1) AS shared)"
        if links
        else "0"
    )
    return f"""
SELECT min(arrival_ns) AS first_arrival_ns,
       count(*) - count(tier) + count(*) - count(server)
         + count(*) - count(arrival_ns) + count(*) - count(departure_ns) AS null_fields,
       sum(CASE WHEN departure_ns < arrival_ns THEN 1 ELSE 0 END) AS backwards,
       {dup} AS shared_ids
FROM {src}
"""


class SharedRequestIds(ValueError):
    """Request ids carried by more than one row: parent_id cannot name one parent row in SQL."""


def preflight(row: Sequence[Any], where: str, *, shared_ids: str = "error") -> int | None:
    """The earliest arrival from a `preflight_query` result row (None for no rows), or ValueError.

    Request ids shared by several rows (a traced run forwards one id along a transaction) raise
    `SharedRequestIds` unless `shared_ids="ignore"` (the caller then leaves the links out).
    """
    first, nulls, backwards, shared = row
    if first is None:
        return None
    if nulls:
        raise ValueError(f"{where}: {nulls} null values in tier, server, arrival_ns or departure_ns")
    if backwards:
        raise ValueError(f"{where}: {backwards} rows have departure_ns < arrival_ns")
    if shared and shared_ids != "ignore":
        raise SharedRequestIds(
            f"{where}: {shared} request ids are carried by more than one row (a run traced before links "
            "gave every row its own id, or a trace written with `tierscope trace --no-link`); parent_id "
            "must name one row's request_id: trace the capture again (`tierscope trace`) for exclusive load"
        )
    return int(first)


def shared_id_count(row: Sequence[Any]) -> int:
    """How many request ids a `preflight_query` row found on more than one row."""
    return int(row[3] or 0)


def sql_query(
    src: str,
    window_ns: int,
    base_ns: int,
    *,
    exclusive: bool = False,
    links: bool | None = None,
    dialect: str = "duckdb",
) -> str:
    """Load, (exclusive load,) and throughput per (tier, server, window) as one query over `src`.

    Definitions as `window_series` (module docstring), in integer ns relative to `base_ns`
    (earlier times clipped to it): each request is exploded into the windows from the one holding
    its arrival to the one holding its departure, its overlap with each summed; the departure's
    window counts a completion. With `exclusive`, each request's children (parent_id =
    request_id, ids unique) are clipped to the request, their union per parent is cut into
    disjoint pieces (in order of start, the part of each child after the latest end among the
    earlier ones: one window function, no sort-and-group into runs), and the pieces are exploded
    the same way with sign −1 at the parent's server: `load_exclusive`. `links=False`
    (no request_id/parent_id columns) makes `load_exclusive` equal `load`. `src` is a table
    expression (`read_parquet(...)`, a view name); `dialect` a key of `SQL_DIALECTS`.
    """
    if dialect not in SQL_DIALECTS:
        raise ValueError(f"unknown SQL dialect {dialect!r}; one of {', '.join(SQL_DIALECTS)}")
    w, b = int(window_ns), int(base_ns)
    links = exclusive if links is None else (links and exclusive)
    explode = SQL_DIALECTS[dialect].format(lo="a - a % w", hi="d - d % w", step="w")
    id_cols = ", request_id, parent_id" if links else ""
    waits = ""
    pieces = "SELECT tier, server, a, d, 1 AS sign FROM r"
    if links:
        waits = """,
-- each child's interval clipped to its parent's, charged to the parent's server
waits AS (
  SELECT p.tier, p.server, p.request_id AS parent, greatest(c.a, p.a) AS s, least(c.d, p.d) AS e
  FROM r AS c JOIN r AS p ON c.parent_id = p.request_id
  WHERE least(c.d, p.d) > greatest(c.a, p.a)
),
-- their union per parent as disjoint pieces: in order of start, the part of each wait after
-- the latest end among the parent's earlier waits (those all start before it, so what they
-- cover of it is one stretch from its start)
fresh AS (
  SELECT tier, server, e AS d,
         greatest(s, coalesce(max(e) OVER (PARTITION BY parent ORDER BY s
                                           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), s)) AS a
  FROM waits
)"""
        pieces += "\n  UNION ALL\n  SELECT tier, server, a, d, -1 AS sign FROM fresh WHERE d > a"
    exclusive_col = (
        "\n       CAST(sum(sign * (least(d, ws + w) - greatest(a, ws))) AS DOUBLE) / w AS load_exclusive,"
        if exclusive
        else ""
    )
    return f"""
WITH r AS (
  -- integer ns since the base (a multiple of the window), earlier times clipped to it
  SELECT tier, server{id_cols},
         greatest(arrival_ns - CAST({b} AS BIGINT), CAST(0 AS BIGINT)) AS a,
         greatest(departure_ns - CAST({b} AS BIGINT), CAST(0 AS BIGINT)) AS d
  FROM {src}
){waits},
pieces AS (
  {pieces}
),
-- one row per (piece, window start) from the arrival's window to the departure's
touched AS (
  SELECT tier, server, a, d, sign, w, {explode} AS ws
  FROM (SELECT tier, server, a, d, sign, CAST({w} AS BIGINT) AS w FROM pieces) AS p
)
SELECT tier, server, CAST({b} AS BIGINT) + ws AS window_start_ns,
       CAST(sum(CASE WHEN sign = 1 THEN least(d, ws + w) - greatest(a, ws) ELSE 0 END) AS DOUBLE) / w
         AS load,{exclusive_col}
       CAST(sum(CASE WHEN sign = 1 AND ws = d - d % w THEN 1 ELSE 0 END) AS DOUBLE) * 1000000000 / w
         AS throughput
FROM touched
GROUP BY tier, server, ws, w
ORDER BY tier, server, window_start_ns
"""
