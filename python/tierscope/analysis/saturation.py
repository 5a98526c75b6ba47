"""The main sequence (load vs throughput per window) and its saturation point N*.

Operational analysis (Denning & Buzen 1978; seed 001 §3.2): a server's throughput grows with its
load until its bottleneck resource is busy all the time, then stays at TPmax. N* is the load at
which that happens; a window whose load exceeds N* is a window in which the server is saturated.
For a server with k identical CPUs and nothing else limiting it, the asymptotes are
X = L / S (below) and X = k / S (above), so N* = k.

The estimator (`saturation_point`, method "asymptotes at the extremes") measures each asymptote
where it holds and intersects them, N* = TPmax / s:

1. Keep windows with load > 0 that are not excluded (windows a known pause touched lie below the
   main sequence — the paper's "points of interest" — and are not the curve itself).
2. Slope s = 1 / S: from `service_s` when given (analyze_fine passes the mean residence of
   requests that found the server idle), else pooled over the tenth of windows whose neighbours'
   load is lowest, s = Σ throughput / Σ load (at low load nothing queues, so Little's law gives
   X = L / S; neighbours, because a window's own load shares its service-time noise).
3. Plateau TPmax: the *median* throughput of the highest-load decile (medians ignore the odd
   window a burst or a pause pushed off the curve).
4. Accept the plateau only if the data show both sides of the knee: the low-load median
   throughput is at most RISE = 70 % of TPmax (the load varied enough to show the rise), within the
   top decile throughput grows with load by at most FLAT = 30 % of the low-load slope (least
   squares; the curve has flattened), and the top decile's median load is at least BEYOND = 2 × N* (queues really
   built up; a stationary server's noise around its mean load does not qualify). Otherwise n_star = inf and `method`
   says which check failed: from such data no saturation point can be read.
5. Except a server saturated during the whole trace: no window shows the rise, but when the slope
   was measured (`service_s`, from requests that found the server idle) and the top decile's
   median load is at least THROUGHOUT = 20 x N*, the plateau is accepted anyway. Load / N* there
   is R / S (Little: L = X·R, N* = X·S): requests stayed at least 20 service times in the server,
   which a single open queue (R = S / (1 − ρ)) reaches only above 95 % utilisation — the white
   box's saturation threshold. The other checks (flat top, beyond the knee) still apply.

Why not a fit through all the windows: at 50 ms, windows whose load is high *because* a long
service or a queue burst happened inside them have fewer completions than their load suggests,
so the middle of the scatter is rounded (an M/M/1's window main sequence is close to
X = L / (S·(1 + L))); a two-segment fit through it lands far from k, while the two extremes are
unaffected. Measured biases on simulated servers are in docs/analysis.md. The binned medians
(`bin_load`, `bin_throughput`) are kept for plotting the main sequence.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

METHOD = "asymptotes at the extremes"
BEYOND = 2.0  # the top decile's median load must be at least this multiple of N*
RISE = 0.7  # the low-load windows must run below this share of the plateau throughput
FLAT = 0.3  # within the top decile, throughput may grow with load at most this share of the low-load slope
THROUGHOUT = 20.0  # with a measured service time: top-decile load this multiple of N* = saturated throughout


@dataclass(frozen=True)
class NStar:
    """The saturation point of one server's main sequence."""

    n_star: float  # load at which throughput stops growing (inf: no plateau in the data)
    method: str  # estimator and outcome, e.g. "binned-median hinge" or "... : no plateau"
    max_throughput: float  # plateau level (requests/s); the highest bin median if no plateau
    slope: float = math.nan  # throughput per unit of load below N* (≈ 1 / service time, 1/s)
    plateau_found: bool = False
    windows_used: int = 0
    bin_load: tuple[float, ...] = field(default=(), repr=False)  # the binned main sequence
    bin_throughput: tuple[float, ...] = field(default=(), repr=False)
    bin_count: tuple[int, ...] = field(default=(), repr=False)
    #: how N* was estimated: "knee" (both asymptotes seen), "saturated throughout" (the slope from
    #: requests that found the server idle, no window at low load), "queue signature" (an upper
    #: bound: residence grows with the queue found at arrival at the server's own rate), or "none"
    basis: str = "none"
    #: "high", "medium" or "low": how far the estimate can be trusted (docs/analysis.md)
    confidence: str = "low"


def saturation_point(
    load: np.ndarray,
    throughput: np.ndarray,
    *,
    exclude: np.ndarray | None = None,
    bins: int = 30,
    min_windows: int = 40,
    service_s: float | None = None,
) -> NStar:
    """N* of one server from its per-window load and throughput (method in the module docstring).

    `load` and `throughput` are per-window arrays of equal length; `exclude` marks windows to
    leave out (e.g. those a known pause touched: they lie below the main sequence).
    `service_s`, when known (e.g. the mean residence of requests that found the server idle,
    `windows.service_when_idle`), gives the low-load slope directly: s = 1 / service_s.
    """
    load = np.asarray(load, np.float64)
    throughput = np.asarray(throughput, np.float64)
    if load.shape != throughput.shape:
        raise ValueError(f"load and throughput differ in length: {load.shape} vs {throughput.shape}")
    load_all = np.nan_to_num(load)
    keep = np.isfinite(load) & np.isfinite(throughput) & (load > 0)
    if exclude is not None:
        keep &= ~np.asarray(exclude, bool)
    x, y = load[keep], throughput[keep]
    method = METHOD
    if x.size < min_windows:
        return NStar(
            math.inf,
            f"{method}: too few windows with load ({x.size} < {min_windows})",
            float(np.max(y)) if y.size else 0.0,
            windows_used=int(x.size),
        )
    bx, by, bn = _binned(x, y, bins)
    common: dict[str, Any] = dict(windows_used=int(x.size), bin_load=bx, bin_throughput=by, bin_count=bn)
    # select the low-load windows by their neighbours' load, not their own: a window's own load
    # and completions share its service-time noise (short services = low load and many
    # completions), its neighbours' do not, while the workload state they reflect persists
    padded = np.r_[load_all[:1], load_all, load_all[-1:]]
    around = ((padded[:-2] + padded[2:]) / 2)[keep]
    q90 = np.quantile(x, 0.90)
    low, high = around <= np.quantile(around, 0.10), x >= q90
    slope = float(y[low].sum() / x[low].sum()) if x[low].sum() > 0 else math.nan
    slope_measured = service_s is not None and service_s > 0 and math.isfinite(service_s)
    if slope_measured and service_s is not None:
        slope = 1.0 / service_s
        method = f"{METHOD}, slope from the service time of requests that found the server idle"
    tp_max = float(np.median(y[high]))
    tp_low = float(np.median(y[low]))
    if not slope > 0 or tp_max <= 0:
        return NStar(math.inf, f"{method}: no completions at low or high load", tp_max, **common)
    n_star = tp_max / slope
    load_high = float(np.median(x[high]))
    reasons = []
    no_rise = tp_low > RISE * tp_max
    if no_rise:
        reasons.append(
            f"throughput at low load ({tp_low:.0f}/s) is already {tp_low / tp_max:.0%} of that at high load: "
            "the load never varied enough to show the rise to a plateau"
        )
    top_slope = float(np.polyfit(x[high], y[high], 1)[0]) if np.ptp(x[high]) > 0 else 0.0
    if top_slope > FLAT * slope:
        reasons.append(
            f"throughput still rising at the highest loads ({top_slope:.0f}/s per unit of load, "
            f"{top_slope / slope:.0%} of the slope at low load)"
        )
    if load_high < BEYOND * n_star:
        reasons.append(
            f"the highest loads (median {load_high:.2f}) are not well past the knee ({n_star:.2f}): "
            "a queue that never builds up is noise, not saturation"
        )
    n_star = max(1.0, n_star)  # a server works on at least one request at a time: X·S below 1 is utilisation
    if reasons == reasons[:1] and no_rise and slope_measured and load_high >= THROUGHOUT * n_star:
        # saturated during the whole trace: no window shows the rise, but the requests that found
        # the server idle give it, and the queue stayed where only a saturated server keeps one
        return NStar(
            n_star,
            f"{method}; saturated throughout: no window shows the rise, and the highest loads "
            f"(median {load_high:.1f}) are {load_high / n_star:.0f} x N*",
            tp_max,
            slope,
            True,
            basis="saturated throughout",
            confidence="medium",
            **common,
        )
    if reasons:
        return NStar(math.inf, f"{method}: no plateau: " + "; ".join(reasons), tp_max, slope, False, **common)
    return NStar(
        n_star,
        method,
        tp_max,
        slope,
        True,
        basis="knee",
        confidence="high" if x.size >= 4 * min_windows else "medium",
        **common,
    )


#: Queue signature: at least this many requests after trimming the trace's edges.
SIGNATURE_MIN_REQUESTS = 200
#: ...finding at least this many others in the server at the 5th percentile (never near idle).
SIGNATURE_MIN_LEVEL = 3
#: ...and residence growing with that number by at least this share of 1/X per request ahead.
SIGNATURE_MIN_RATE = 0.5
#: ...with neither half of the curve flatter than this share of it.
SIGNATURE_FLAT_RATE = 0.2


@dataclass(frozen=True)
class QueueSignature:
    """How a server's residence depends on the queue its requests found (`queue_signature`)."""

    saturated: bool  # served at its own maximum rate over the whole range of queues seen
    rate_ratio: float  # residence slope per request ahead x throughput (1: each costs 1/X)
    low_rate_ratio: float  # the same over the lower half of the queues seen
    level_low: float  # 5th percentile of the number found in the server at arrival
    level_floor: float  # 1st percentile: down to where the queue was seen
    level_median: float
    requests: int
    text: str


def queue_signature(level: np.ndarray, own_s: np.ndarray, throughput: float, bins: int = 10) -> QueueSignature:
    """Whether a server that is never idle is saturated, from its requests alone.

    `level`: per request, the number of other requests in the server when it arrived (exclusive of
    those downstream); `own_s`: its own residence (s); `throughput`: the server's completions per
    second over the same span. A saturated work-conserving server works at its maximum rate X
    whatever the queue, so a request that finds n others leaves after about (n + 1) / X: residence
    grows with n at slope 1/X, from the lowest queue seen to the highest. A server with spare
    capacity serves extra requests in parallel (slope near 0, over the whole curve), and one that is only sometimes
    short of capacity is idle or nearly so at times (its 5th percentile of n is low) and is judged
    by the main sequence instead. The slope is a least-squares line through the median residence
    of `bins` quantile bins of n (medians: the service times' spread), over all bins and over the
    lower half alone (a flat part at low n means capacity left below the queues seen)."""
    level = np.asarray(level, np.float64)
    own_s = np.asarray(own_s, np.float64)
    n = int(level.size)
    nope = QueueSignature(False, math.nan, math.nan, math.nan, math.nan, math.nan, n, "")
    if n < SIGNATURE_MIN_REQUESTS or not throughput > 0:
        return dataclasses.replace(nope, text=f"too few requests ({n}) for the queue signature")
    floor, low, med = (float(v) for v in np.quantile(level, [0.01, 0.05, 0.5]))
    edges = np.unique(np.quantile(level, np.linspace(0, 1, bins + 1)))
    which = np.clip(np.searchsorted(edges, level, side="right") - 1, 0, max(edges.size - 2, 0))
    bx, by, bw = [], [], []
    for b in range(max(edges.size - 1, 1)):
        sel = which == b
        if sel.sum() >= 20:
            bx.append(float(np.median(level[sel])))
            by.append(float(np.median(own_s[sel])))
            bw.append(float(sel.sum()))
    base = dataclasses.replace(nope, level_low=low, level_floor=floor, level_median=med)
    if len(bx) < 3 or np.ptp(bx) <= 0:
        return dataclasses.replace(base, text=f"the queue found at arrival hardly varies (median {med:.0f})")
    bx_a, by_a, bw_a = np.asarray(bx), np.asarray(by), np.asarray(bw)
    slope = float(np.polyfit(bx_a, by_a, 1, w=np.sqrt(bw_a))[0])
    half = bx_a <= np.median(bx_a)
    low_slope = float(np.polyfit(bx_a[half], by_a[half], 1)[0]) if half.sum() >= 2 and np.ptp(bx_a[half]) > 0 else slope
    ratio, low_ratio = slope * throughput, low_slope * throughput
    # one of the two at the full rate, the other not flat: a burst that ends in a pause (a freeze
    # every second) flattens the top or the bottom of the curve, spare capacity flattens both
    saturated = (
        low >= SIGNATURE_MIN_LEVEL
        and max(ratio, low_ratio) >= SIGNATURE_MIN_RATE
        and min(ratio, low_ratio) >= SIGNATURE_FLAT_RATE
    )
    text = (
        f"residence grows by {slope * 1e3:.2f} ms per request found in the server ({ratio:.2f} x 1/X at "
        f"{throughput:.0f}/s; {low_ratio:.2f} over the lower half) with {floor:.0f} to {float(np.max(level)):.0f} "
        f"found (1st percentile to max)"
    )
    return QueueSignature(saturated, ratio, low_ratio, low, floor, med, n, text)


def residence_knee(
    level: np.ndarray, own_s: np.ndarray, service_s: float, min_per_bin: int = 10, bins: int = 16
) -> tuple[float, str]:
    """N* from the requests' own main sequence: residence against the number found at arrival.

    A server that can work on k requests at once serves a request that finds n < k others in its
    service time S, and one that finds n >= k after the n - k + 1 ahead of it have left, at k per
    S: R(n) = S for n < k, S + (n - k + 1)·S / k above (first come, first served; processor sharing
    is close). With S measured (requests that found the server idle), k is the one unknown: the
    integer that fits the mean residence of log-spaced bins of n best (squared error of the logs,
    weighted by the bins' counts). Accepted when at least two bins lie at 2k or beyond, where the
    residence is at least 1.5 S (the queue was seen well past the knee and made requests wait);
    else (inf, why). This sees a knee that bursts reach but the windows' deciles do not."""
    level = np.asarray(level, np.int64)
    own_s = np.asarray(own_s, np.float64)
    if level.size == 0 or not service_s > 0:
        return math.inf, "no requests or no service time"
    top = int(level.max())
    edges = np.unique(np.round(np.geomspace(1, top + 2, bins)).astype(np.int64))
    edges = np.r_[0, edges]
    which = np.searchsorted(edges, level, side="right") - 1
    bx, by, bw = [], [], []
    for b in range(edges.size):
        sel = which == b
        if sel.sum() >= min_per_bin:
            bx.append(float(level[sel].mean()))
            by.append(float(own_s[sel].mean()))
            bw.append(float(sel.sum()))
    if len(bx) < 3:
        return math.inf, "the queue found at arrival took too few values"
    x, y, w = np.asarray(bx), np.asarray(by), np.asarray(bw)

    def model(k: int) -> np.ndarray:
        return np.where(x < k, service_s, service_s + (x - k + 1) * service_s / k)

    candidates = range(1, max(2, int(x.max())) + 1)
    errors = [float(np.sum(w * (np.log(np.maximum(y, 1e-9)) - np.log(model(k))) ** 2)) for k in candidates]
    k = candidates[int(np.argmin(errors))]
    past = x >= 2 * k
    if past.sum() < 2 or not (y[past] >= 1.5 * service_s).all():
        return math.inf, (
            f"residence against the queue found at arrival shows no knee below half the largest "
            f"queues seen (best fit {k}, {int(past.sum())} bins beyond 2x it)"
        )
    return float(k), (
        f"knee of residence against the queue found at arrival: {k} (S = {service_s * 1e3:.2f} ms; "
        f"{int(past.sum())} of {x.size} bins beyond 2x it, residence there "
        f"{y[past].min() / service_s:.1f}-{y[past].max() / service_s:.1f} x S)"
    )


def from_residence_knee(ns: NStar, k: float, text: str) -> NStar:
    """N* from `residence_knee` for a server whose windows showed no plateau."""
    return dataclasses.replace(
        ns,
        n_star=max(1.0, k),
        plateau_found=True,
        basis="residence knee",
        confidence="medium",
        method=f"{text}; the main sequence alone: {ns.method}",
    )


#: Quantile of a label's residence taken as its service time when no request found the server idle.
FLOOR_QUANTILE = 0.01


def residence_floor(own_s: np.ndarray, labels: np.ndarray, throughput: float, level_median: float) -> NStar | None:
    """N* of a server that is never idle and whose queue hardly varies (neither the main sequence
    nor the queue signature can place it), from the shortest residences of each label: a label's
    FLOOR_QUANTILE residence stands for its service time, N* = X x the count-weighted mean of those
    (throughput x service time; at least 1). Accepted as saturated when the median number found in
    the server is at least twice that; low confidence: a server whose requests wait on something
    unseen (an untraced call, a lock) looks the same."""
    own_s = np.asarray(own_s, np.float64)
    if own_s.size < SIGNATURE_MIN_REQUESTS or not throughput > 0:
        return None
    values, inverse = np.unique(np.asarray(labels, object).astype(str), return_inverse=True)
    floors = np.asarray([np.quantile(own_s[inverse == i], FLOOR_QUANTILE) for i in range(values.size)])
    counts = np.bincount(inverse, minlength=values.size)
    service = float(np.sum(floors * counts) / counts.sum())
    n_star = max(1.0, throughput * service)
    if level_median < 2 * n_star:
        return None
    return NStar(
        n_star,
        f"shortest residences: N* about {n_star:.1f} = {throughput:.0f}/s x {service * 1e3:.2f} ms "
        f"(the {FLOOR_QUANTILE:.0%} residence of each of {values.size} labels); never idle, "
        f"{level_median:.0f} found in the server at the median: saturated throughout "
        "(low confidence: waiting on something unseen looks the same)",
        throughput,
        1.0 / service if service > 0 else math.nan,
        True,
        basis="shortest residences",
        confidence="low",
    )


def from_signature(ns: NStar, sig: QueueSignature) -> NStar:
    """N* of a server the main sequence could not place but whose queue signature shows it saturated:
    at most the low end of the queues seen (the 1st percentile: its residence grew at the full rate
    from the lowest queues seen on)."""
    bound = max(1.0, sig.level_floor)
    return dataclasses.replace(
        ns,
        n_star=bound,
        plateau_found=True,
        basis="queue signature",
        confidence="medium",
        method=f"queue signature: N* at most {bound:.0f} (saturated throughout: {sig.text}); "
        f"the main sequence alone: {ns.method}",
    )


def _binned(x: np.ndarray, y: np.ndarray, bins: int) -> tuple[tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]]:
    """Median load and throughput per load bin (geometric bins between q0.5 % and q99.5 %)."""
    bottom, top = (float(v) for v in np.quantile(x, [0.005, 0.995]))
    if top <= bottom:
        return (float(np.median(x)),), (float(np.median(y)),), (int(x.size),)
    edges = np.geomspace(bottom, top, bins + 1)
    which = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, bins - 1)
    need = max(3, int(0.002 * x.size))
    bx, by, bn = [], [], []
    for b in range(bins):
        sel = which == b
        n = int(sel.sum())
        if n >= need:
            bx.append(float(np.median(x[sel])))
            by.append(float(np.median(y[sel])))
            bn.append(n)
    return tuple(bx), tuple(by), tuple(bn)


def saturated_windows(load: np.ndarray, n_star: float) -> np.ndarray:
    """Windows whose load exceeds N* (bool per window)."""
    return np.asarray(load, np.float64) > n_star


def episodes(saturated: np.ndarray, window_start_ns: np.ndarray, window_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """Maximal runs of consecutive saturated windows: (start_ns, end_ns) arrays."""
    sat = np.asarray(saturated, bool)
    if not sat.any():
        empty = np.zeros(0, np.int64)
        return empty, empty
    d = np.diff(np.r_[0, sat.astype(np.int8), 0])
    first = np.flatnonzero(d == 1)
    last = np.flatnonzero(d == -1) - 1
    starts = np.asarray(window_start_ns, np.int64)
    return starts[first], starts[last] + np.int64(window_ns)
