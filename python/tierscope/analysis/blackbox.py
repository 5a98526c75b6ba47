"""Black-box analysis across the points of an experiment (seed 004 §3, seed 000 §3): the system seen
from outside, as the users see it.

For each workload level (number of emulated users) the **load curve** gives throughput
(completed requests per second of the measured interval) and response time (mean, p90, p99, in
seconds). On that curve:

* the **maximum throughput** is the largest throughput of any level;
* the **knee** is the workload where response time starts to grow sharply (seed 004 reads it off
  the 90th percentile). Two documented estimators:

  - ``kneedle`` (default; Satopää et al., "Finding a 'Kneedle' in a Haystack", ICDCSW 2011): scale
    users and response time to [0, 1]; for a convex increasing curve the knee is the level that
    maximises ``users_scaled - rt_scaled`` (the farthest point below the chord from the first to the
    last level). Needs no model and no think time; the answer is one of the measured levels.
  - ``bounds`` (asymptotic bounds of a closed queueing network, Denning & Buzen; the interactive
    response-time law X = N / (R + Z)): with light-load response time R₀ (the smallest measured
    response time, ≈ the total service demand D) and maximum throughput X_max (= 1 / D_max),
    the curves R = R₀ and R = N / X_max − Z cross at **N\\* = (R₀ + Z) · X_max** users. Below N\\*
    the law is met with R ≈ R₀; above it the bottleneck's capacity makes R grow by 1/X_max per user.
    Needs the think time Z.

Pure functions: tables in, tables out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: Columns of the load curve.
CURVE_COLUMNS = ("users", "requests", "errors", "seconds", "throughput", "rt_mean", "rt_p50", "rt_p90", "rt_p99")


@dataclass(frozen=True)
class Knee:
    """Where response time starts to climb: `users` (a measured level for kneedle), the method."""

    users: float
    method: str
    index: int | None  # index of the level in the curve (kneedle); None for bounds
    detail: str


@dataclass(frozen=True)
class BlackBox:
    """The load curve, its knee and the maximum throughput (requests/s at `max_throughput_users`)."""

    curve: pa.Table
    knee: Knee | None
    max_throughput: float
    max_throughput_users: float
    knee_bounds: Knee | None = None


def _times(table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, end, error mask) of the requests to count: the `run` phase when there is one."""
    if "phase" in table.column_names and pc.any(pc.equal(table.column("phase"), "run")).as_py():
        table = table.filter(pc.equal(table.column("phase"), "run"))
    if "start_ns" in table.column_names:
        start, end = table.column("start_ns"), table.column("end_ns")
    else:
        start, end = table.column("arrival_ns"), table.column("departure_ns")
    error = np.zeros(table.num_rows, dtype=bool)
    if "error" in table.column_names:
        error |= table.column("error").is_valid().to_numpy(zero_copy_only=False)
    if "status" in table.column_names:
        status = pc.cast(table.column("status"), pa.string())
        bad = pc.or_(pc.or_(pc.equal(status, "0"), pc.equal(status, "ERROR")), pc.starts_with(status, "5"))
        error |= np.asarray(pc.fill_null(bad, False).to_numpy(zero_copy_only=False), bool)
    return (
        np.asarray(start.to_numpy(zero_copy_only=False), np.int64),
        np.asarray(end.to_numpy(zero_copy_only=False), np.int64),
        error,
    )


def point_summary(users: float, requests: pa.Table, seconds: float | None = None) -> dict[str, Any]:
    """Throughput and response-time statistics of one workload level.

    `requests` is a `client_requests` table (start_ns/end_ns, phase, error, status) or a `requests`
    table of the front tier (arrival_ns/departure_ns). Throughput counts successful completions
    over `seconds` (default: first start to last end of the counted requests). Response times are
    of successful requests, in seconds.
    """
    start, end, error = _times(requests)
    ok = ~error
    rt = (end[ok] - start[ok]) / 1e9
    if seconds is None:
        seconds = (int(end.max()) - int(start.min())) / 1e9 if len(start) else 0.0
    return {
        "users": float(users),
        "requests": int(ok.sum()),
        "errors": int(error.sum()),
        "seconds": float(seconds),
        "throughput": float(ok.sum() / seconds) if seconds > 0 else float("nan"),
        "rt_mean": float(rt.mean()) if len(rt) else float("nan"),
        "rt_p50": float(np.percentile(rt, 50)) if len(rt) else float("nan"),
        "rt_p90": float(np.percentile(rt, 90)) if len(rt) else float("nan"),
        "rt_p99": float(np.percentile(rt, 99)) if len(rt) else float("nan"),
    }


def load_curve(points: Sequence[tuple[float, pa.Table]] | Sequence[tuple[float, pa.Table, float]]) -> pa.Table:
    """The load curve: one row per workload level (sorted by users), columns `CURVE_COLUMNS`.

    Each point is ``(users, requests)`` or ``(users, requests, seconds)``.
    """
    rows = [point_summary(*p) for p in points]
    rows.sort(key=lambda r: r["users"])
    return pa.Table.from_pylist(
        rows,
        schema=pa.schema([(c, pa.float64() if c not in ("requests", "errors") else pa.int64()) for c in CURVE_COLUMNS]),
    )


def knee_kneedle(users: Sequence[float], response_time: Sequence[float]) -> Knee | None:
    """The knee of an increasing, convex response-time curve by Kneedle (see module docstring).

    None when there are fewer than three levels or response time does not grow.
    """
    x = np.asarray(users, float)
    y = np.asarray(response_time, float)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if len(x) < 3 or np.ptp(x) <= 0 or np.ptp(y) <= 0:
        return None
    order = np.argsort(x)
    x, y = x[order], y[order]
    xs = (x - x[0]) / (x[-1] - x[0])
    ys = (y - y.min()) / np.ptp(y)
    diff = xs - ys
    i = int(np.argmax(diff))
    if diff[i] <= 0:
        return None
    return Knee(
        users=float(x[i]),
        method="kneedle",
        index=int(order[i]),
        detail=f"Kneedle on response time vs users: largest gap {diff[i]:.2f} below the chord at {x[i]:g} users",
    )


def knee_bounds(light_load_rt_s: float, max_throughput: float, think_time_s: float) -> Knee:
    """N* = (R₀ + Z) · X_max, where the asymptotic bounds of a closed network cross (see module docstring)."""
    n_star = (light_load_rt_s + think_time_s) * max_throughput
    return Knee(
        users=float(n_star),
        method="bounds",
        index=None,
        detail=f"asymptotic bounds: N* = (R0 {light_load_rt_s * 1e3:.1f} ms + Z {think_time_s:g} s) "
        f"x X_max {max_throughput:.1f}/s = {n_star:.0f} users",
    )


def blackbox(curve: pa.Table, think_time_s: float | None = None, response_time: str = "rt_p90") -> BlackBox:
    """Knee (kneedle on `response_time`, and bounds when the think time is known) and maximum throughput."""
    users = curve.column("users").to_numpy()
    x = curve.column("throughput").to_numpy(zero_copy_only=False)
    finite = np.isfinite(x)
    if not finite.any():
        return BlackBox(curve, None, float("nan"), float("nan"))
    i = int(np.nanargmax(np.where(finite, x, -np.inf)))
    knee = knee_kneedle(users, curve.column(response_time).to_numpy(zero_copy_only=False))
    bounds = None
    if think_time_s is not None and curve.num_rows >= 2:  # a light load and a heavy one are needed
        r0 = float(np.nanmin(curve.column("rt_mean").to_numpy(zero_copy_only=False)))
        bounds = knee_bounds(r0, float(x[i]), think_time_s)
    return BlackBox(curve, knee, float(x[i]), float(users[i]), bounds)
