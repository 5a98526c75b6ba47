"""Pauses (GC, injected stop-the-world freezes) against load, per window (seed 001 Fig. 6b).

The *pause ratio* of a window is the share of it covered by a host's pause events (the "GC
running ratio"). A host is matched to servers by name: an events host equal to a server name
belongs to that server; equal to a tier name, to every server of the tier.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .alternation import pearson
from .windows import Intervals, accumulate_intervals, interval_ratio

#: Event kinds that stop a server's work.
PAUSE_KINDS = ("gc", "injected_pause", "pause", "freeze", "silence")  # silence: `analysis.silences`


def pause_ratio_by_server(
    events: pa.Table | None,
    servers: list[tuple[str, str]],
    base_ns: int,
    n_windows: int,
    window_ns: int,
) -> tuple[dict[tuple[str, str], np.ndarray], list[str]]:
    """Per (tier, server): the pause ratio of every window; and the event hosts matching no server."""
    out: dict[tuple[str, str], np.ndarray] = {}
    if events is None or events.num_rows == 0:
        return out, []
    for name in ("start_ns", "end_ns", "host", "kind"):
        if name not in events.column_names:
            raise ValueError(f"events: required column {name!r} is missing")
    kinds = pc.is_in(events.column("kind"), value_set=pa.array(PAUSE_KINDS))
    pauses = events.filter(kinds)
    hosts = pauses.column("host").to_pylist()
    start = pauses.column("start_ns").to_numpy().astype(np.int64)
    end = pauses.column("end_ns").to_numpy().astype(np.int64)
    unmatched = set()
    for host in sorted(set(hosts)):
        sel = np.asarray([h == host for h in hosts])
        targets = [key for key in servers if key[1] == host] or [key for key in servers if key[0] == host]
        if not targets:
            unmatched.add(host)
            continue
        ratio = np.minimum(interval_ratio(start[sel], end[sel], base_ns, n_windows, window_ns), 1.0)
        for key in targets:
            out[key] = np.maximum(out.get(key, 0.0), ratio)
    return out, sorted(unmatched)


def pause_spans_by_server(
    events: pa.Table | None, servers: list[tuple[str, str]]
) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    """Per (tier, server): its pauses as merged, sorted (start_ns, end_ns) arrays (epoch ns)."""
    out: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
    if events is None or events.num_rows == 0:
        return out
    pauses = events.filter(pc.is_in(events.column("kind"), value_set=pa.array(PAUSE_KINDS)))
    hosts = pauses.column("host").to_pylist()
    start = pauses.column("start_ns").to_numpy().astype(np.int64)
    end = pauses.column("end_ns").to_numpy().astype(np.int64)
    for host in sorted(set(hosts)):
        sel = np.asarray([h == host for h in hosts])
        targets = [key for key in servers if key[1] == host] or [key for key in servers if key[0] == host]
        for key in targets:
            a = np.concatenate([out[key][0], start[sel]]) if key in out else start[sel]
            b = np.concatenate([out[key][1], end[sel]]) if key in out else end[sel]
            order = np.argsort(a, kind="stable")
            a, b = a[order], np.maximum.accumulate(b[order])
            new = np.r_[True, a[1:] > b[:-1]]
            first = np.flatnonzero(new)
            out[key] = (a[first], np.maximum.reduceat(b, first))
    return out


def pause_table(
    ratios: dict[tuple[str, str], np.ndarray],
    load: dict[tuple[str, str], np.ndarray],
    window_ns: int,
) -> pa.Table:
    """One row per paused server: pause count proxy, paused share of time, corr(load, pause ratio)."""
    rows: dict[str, list[Any]] = {
        "tier": [],
        "server": [],
        "host": [],
        "paused_share": [],
        "paused_windows": [],
        "corr_load_vs_pause_ratio": [],
    }
    for (tier, server), ratio in sorted(ratios.items()):
        series = load.get((tier, server))
        corr = pearson(series, ratio) if series is not None else math.nan
        rows["tier"].append(tier)
        rows["server"].append(server)
        rows["host"].append(server)
        rows["paused_share"].append(float(ratio.mean()) if ratio.size else 0.0)
        rows["paused_windows"].append(int((ratio > 0).sum()))
        rows["corr_load_vs_pause_ratio"].append(corr)
    return pa.table(
        {
            "tier": pa.array(rows["tier"], pa.string()),
            "server": pa.array(rows["server"], pa.string()),
            "host": pa.array(rows["host"], pa.string()),
            "paused_share": pa.array(rows["paused_share"], pa.float64()),
            "paused_windows": pa.array(rows["paused_windows"], pa.int64()),
            "corr_load_vs_pause_ratio": pa.array(rows["corr_load_vs_pause_ratio"], pa.float64()),
        }
    )


def paused_share_above(
    parts: list[Any],
    pause_spans: dict[int, tuple[np.ndarray, np.ndarray]],
    thresholds: np.ndarray,
    n_servers: int,
    n_windows: int,
    window_ns: int,
) -> np.ndarray:
    """Share of each window during which a server was paused *and* held more than its threshold of
    requests; shape (n_servers, n_windows).

    `parts` are the `windows.Intervals` of `windows.request_intervals` (relative to a base), and
    `pause_spans[server code]` the server's merged, sorted pause (start, end) arrays relative to the
    same base. With threshold 0 this is the time a stopped server held work it could not serve:
    its capacity was zero, so every request in it waited (the simulator's ground truth counts a
    frozen server holding a request as saturated).
    """

    out = np.zeros((n_servers, n_windows))
    seg_srv, seg_a, seg_b = [], [], []
    limit = np.int64(n_windows) * np.int64(window_ns)
    for srv, (ps, pe) in pause_spans.items():
        thr = float(thresholds[srv])
        if not np.isfinite(thr) or len(ps) == 0:
            continue
        times, deltas = [], []
        for part in parts:
            m = part.server == srv
            times += [part.start[m], part.end[m]]
            deltas += [np.full(int(m.sum()), part.sign, np.int32), np.full(int(m.sum()), -part.sign, np.int32)]
        t = np.concatenate(times)
        d = np.concatenate(deltas)
        if t.size < 2:
            continue
        order = np.lexsort((d, t))  # at one instant, departures before arrivals
        t, d = t[order], d[order]
        level = np.cumsum(d)
        above = level[:-1] > thr
        a, b = t[:-1][above], t[1:][above]
        keep = b > a
        a, b = a[keep], b[keep]  # disjoint, in time order
        for s, e in zip(np.clip(ps, 0, limit), np.clip(pe, 0, limit)):
            lo = int(np.searchsorted(b, s, "right"))
            hi = int(np.searchsorted(a, e, "left"))
            if hi <= lo:
                continue
            ca, cb = np.maximum(a[lo:hi], s), np.minimum(b[lo:hi], e)
            k = cb > ca
            seg_srv.append(np.full(int(k.sum()), srv, np.int32))
            seg_a.append(ca[k])
            seg_b.append(cb[k])
    if not seg_srv:
        return out
    part = Intervals(
        np.concatenate(seg_srv), np.concatenate(seg_a).astype(np.int64), np.concatenate(seg_b).astype(np.int64), +1
    )
    integral, _ = accumulate_intervals([part], n_servers, n_windows + 1, window_ns)
    return integral.reshape(n_servers, n_windows + 1)[:, :n_windows] / window_ns
