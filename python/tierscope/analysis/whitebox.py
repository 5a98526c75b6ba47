"""White-box analysis across the points of an experiment (seed 000 §3.1 Fig. 1, seed 004 §5.2): the
distribution of each resource's utilisation at each workload level, not its average.

* **Kernel density** of utilisation (percent, 0–100) per resource and workload level: a Gaussian
  kernel evaluated on a grid, with the bandwidth from Scott's rule (σ·n^(−1/5)) but never below
  `min_bandwidth` percentage points, and *reflection* at 0 % and 100 % so that a resource pinned at
  100 % shows its peak at 100 rather than half a bump. Samples are first binned at the grid
  resolution (a "histogram KDE"), so the cost is O(samples + grid²) however long the run.
  The density integrates to 1 over [0, 100]; read it as "share of time per percentage point".
* **Share of time above 95 %** per resource and level.
* A resource is **saturated** at a level when the majority of its samples lie in the top five
  percent (share above 95 % ≥ `min_share`, default 0.5), as seed 000 reads its density graphs:
  "past that workload the majority of values lay in the top five percent utilisation interval".
  A software limit (sockets: the connections a server can be asked for) is listed after the
  hardware and is the primary bottleneck only when no hardware resource is saturated at that
  level (`hardware_first`, seed 004 §5).

**Which metrics.** Every `resources` row with unit ``percent`` is a utilisation (values above 100,
e.g. a disk rate briefly past its throttle, count as 100): CPU (``cpu_util``, ``cpu``), the CPU
quota (``cpu_quota``), disk (``disk_util``; the machine's ``disk_util_<disk>``), memory
(``mem_util``), sockets (``sockets_util``), a database's busy connections or an app server's
connections taken from its pools (``connections_util``, the runner's `runner.activity`). ``cpu_user`` + ``cpu_system`` of the same host and
sample time are also summed into a derived ``cpu`` metric (capped at 100) when a host reports both
in percent and no ``cpu`` of its own. A metric in another unit (ops/s, bytes, bytes/s, a count)
enters the densities only when the caller gives its ceiling in `limits` (``{(host, metric):
ceiling}``, host ``"*"`` for every host): it becomes the utilisation ``UTILISATION_OF[metric]``
(e.g. ``sockets_established`` against a pool of 16 -> ``sockets_util``, ``disk_write_ops`` against
an IOPS limit -> ``disk_util``; several metrics of one utilisation take the highest per sample)
unless the host already reports that utilisation. Everything else (network bytes, page-cache misses,
swap) is a rate or a level without a ceiling and stays out of the densities.

**Cross-check** (`saturated_in_tiers`): given the tiers a fine-grained verdict names, the
resources of those tiers' hosts that were saturated at a level, named as resources
(`resource_of`: "CPU", "CPU quota", "disk", "memory", "sockets", "connections"), so a verdict can read
"db, disk-bound" (`bound_words`).

**Two grains** (`two_grains`): one host's utilisation sampled at a fine interval (50 ms) and the
same samples re-aggregated to 1 s, with each grain's share of samples above 95 % (seed 001: no
resource is saturated at 1 s while the 50 ms samples show saturation).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tierscope.tiers import tier_of_host

GRID = np.linspace(0.0, 100.0, 201)  # 0.5 percentage-point steps
SATURATION_THRESHOLD = 95.0
MIN_SHARE = 0.5

#: the utilisation a non-percent metric becomes when its ceiling is given (see the module doc)
UTILISATION_OF = {
    "disk_read_ops": "disk_util", "disk_write_ops": "disk_util",
    "disk_read_bytes": "disk_util", "disk_write_bytes": "disk_util",
    "mem_usage": "mem_util", "mem_working_set": "mem_util",
    "sockets_established": "sockets_util", "sockets_tcp": "sockets_util",
    "db_connections_busy": "connections_util",
    "cpu_user": "cpu", "cpu_system": "cpu",
}  # fmt: skip

#: utilisation metric (or its prefix, for the machine's per-disk metrics) -> the resource it measures
_RESOURCE_PREFIX = (
    ("cpu_quota", "CPU quota"), ("cpu_util", "CPU"), ("cpu_user", "CPU"), ("cpu_system", "CPU"), ("cpu", "CPU"),
    ("disk_util", "disk"), ("mem_util", "memory"), ("sockets_util", "sockets"), ("connections_util", "connections"),
)  # fmt: skip


#: resources that are software limits (the connections a server can be asked for), not hardware:
#: the primary bottleneck only where no hardware resource is saturated at that level (seed 004 §5:
#: with part of the database in memory the database's sockets were pinned at their maximum "with
#: neither the CPU nor the disk" saturated, the bottleneck; with most of it on disk they were
#: pinned too, at times, but the disk was saturated: the disk was the bottleneck, the sockets
#: held by requests waiting for it)
SOFT_RESOURCES = frozenset({"sockets", "connections"})


def is_soft(metric: str) -> bool:
    """Whether the utilisation metric measures a software limit (`SOFT_RESOURCES`)."""
    return resource_of(metric) in SOFT_RESOURCES


def hardware_first(shares: Mapping[Any, float], min_share: float = MIN_SHARE) -> dict[Any, float]:
    """`shares` (``(host, metric)`` -> share above 95 % at one level) without the soft resources
    when a hardware resource reaches `min_share` (`SOFT_RESOURCES`): what the primary bottleneck
    is chosen from."""
    hard = {k: v for k, v in shares.items() if not is_soft(k[1])}
    return hard if any(v >= min_share for v in hard.values()) else dict(shares)


def resource_of(metric: str) -> str:
    """The resource a utilisation metric measures: "CPU", "CPU quota", "disk", "memory", "sockets",
    "connections" (the metric itself for anything else)."""
    for prefix, name in _RESOURCE_PREFIX:
        if metric == prefix or metric.startswith(prefix + "_"):
            return name
    return metric


@dataclass(frozen=True)
class WhiteBox:
    """Densities (users, host, metric, util, density), shares (users, host, metric, samples, mean,
    p50, share_above), and the saturated resources per level."""

    density: pa.Table
    shares: pa.Table
    saturated: dict[float, list[tuple[str, str]]]


def _ceiling(limits: Mapping[tuple[str, str], float], host: str, metric: str) -> float | None:
    c = limits.get((host, metric), limits.get(("*", metric)))
    if c is None:
        return None
    if not c > 0:
        raise ValueError(f"limits: the ceiling of {host} {metric} must be above 0, got {c!r}")
    return float(c)


def utilisation_samples(
    resources: pa.Table, limits: Mapping[tuple[str, str], float] | None = None
) -> dict[tuple[str, str], np.ndarray]:
    """(host, metric) -> utilisation samples in percent, in time order: the ``percent`` rows, the
    derived `cpu` = user + system, and metrics normalised by `limits` (see the module doc)."""
    t = resources.sort_by([("ts_ns", "ascending")]) if resources.num_rows else resources
    percent = t.filter(pc.equal(t.column("unit"), "percent"))
    out: dict[tuple[str, str], list[Any]] = {}
    hosts = percent.column("host").to_pylist()
    metrics = percent.column("metric").to_pylist()
    values = percent.column("value").to_numpy(zero_copy_only=False)
    ts = percent.column("ts_ns").to_numpy(zero_copy_only=False)
    cpu_parts: dict[tuple[str, int], float] = {}
    for h, m, v, s in zip(hosts, metrics, values, ts):
        out.setdefault((h, m), []).append(v)
        if m in ("cpu_user", "cpu_system"):
            cpu_parts[(h, int(s))] = cpu_parts.get((h, int(s)), 0.0) + float(v)
    both = {h for h, m in out if m == "cpu_user"} & {h for h, m in out if m == "cpu_system"}
    for (h, _s), v in sorted(cpu_parts.items(), key=lambda kv: kv[0][1]):
        if h in both and (h, "cpu") not in out:
            out.setdefault((h, "cpu*"), []).append(min(v, 100.0))
    for h in both:
        if (h, "cpu*") in out:
            out[(h, "cpu")] = out.pop((h, "cpu*"))
    if limits:
        other = t.filter(pc.not_equal(t.column("unit"), "percent"))
        derived: dict[tuple[str, str], dict[int, float]] = {}
        for h, m, v, s in zip(
            other.column("host").to_pylist(),
            other.column("metric").to_pylist(),
            other.column("value").to_numpy(zero_copy_only=False),
            other.column("ts_ns").to_numpy(zero_copy_only=False),
        ):
            util = UTILISATION_OF.get(m)
            if util is None or (h, util) in out:
                continue
            ceiling = _ceiling(limits, h, m)
            if ceiling is None:
                continue
            per_ts = derived.setdefault((h, util), {})
            per_ts[int(s)] = max(per_ts.get(int(s), 0.0), 100.0 * float(v) / ceiling)
        for key, per_ts in derived.items():
            out[key] = [per_ts[s] for s in sorted(per_ts)]
    return {k: np.asarray(v, float) for k, v in out.items()}


def density(samples: np.ndarray, grid: np.ndarray = GRID, min_bandwidth: float = 1.0) -> np.ndarray:
    """Reflected Gaussian kernel density of utilisation samples (percent) on `grid` (see module doc)."""
    x = np.clip(np.asarray(samples, float), 0.0, 100.0)
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return np.zeros_like(grid)
    h = max(min_bandwidth, float(np.std(x)) * len(x) ** (-0.2)) if len(x) > 1 else min_bandwidth
    step = grid[1] - grid[0]
    idx = np.clip(np.rint((x - grid[0]) / step).astype(int), 0, len(grid) - 1)
    weights = np.bincount(idx, minlength=len(grid)) / len(x)
    centres = grid[:, None]
    k = np.zeros((len(grid), len(grid)))
    for mirror in (grid, -grid, 200.0 - grid):  # the samples, reflected at 0 and at 100
        k += np.exp(-0.5 * ((centres - mirror[None, :]) / h) ** 2)
    dens = k @ weights / (h * np.sqrt(2 * np.pi))
    area = np.trapezoid(dens, grid)
    out: np.ndarray = dens / area if area > 0 else dens
    return out


SHARES_SCHEMA = pa.schema([("users", pa.float64()), ("host", pa.string()), ("metric", pa.string()),
                           ("samples", pa.int64()), ("mean", pa.float64()), ("p50", pa.float64()),
                           ("share_above", pa.float64())])  # fmt: skip
DENSITY_SCHEMA = pa.schema([("users", pa.float64()), ("host", pa.string()), ("metric", pa.string()),
                            ("util", pa.float64()), ("density", pa.float64())])  # fmt: skip


def whitebox(
    points: Sequence[tuple[float, pa.Table]],
    threshold: float = SATURATION_THRESHOLD,
    min_share: float = MIN_SHARE,
    grid: np.ndarray = GRID,
    limits: Mapping[tuple[str, str], float] | None = None,
) -> WhiteBox:
    """Densities, shares above `threshold` and saturated resources for each ``(users, resources)``
    point; `limits` bring non-percent metrics in (see the module doc)."""
    dens_rows: dict[str, list[Any]] = {"users": [], "host": [], "metric": [], "util": [], "density": []}
    share_rows: list[dict[str, Any]] = []
    saturated: dict[float, list[tuple[str, str]]] = {}
    for users, resources in sorted(points, key=lambda p: p[0]):
        users = float(users)
        saturated.setdefault(users, [])
        for (host, metric), x in sorted(utilisation_samples(resources, limits).items()):
            d = density(x, grid)
            n = len(grid)
            dens_rows["users"] += [users] * n
            dens_rows["host"] += [host] * n
            dens_rows["metric"] += [metric] * n
            dens_rows["util"] += grid.tolist()
            dens_rows["density"] += d.tolist()
            share = float(np.mean(x >= threshold)) if len(x) else 0.0
            share_rows.append(
                {
                    "users": users,
                    "host": host,
                    "metric": metric,
                    "samples": len(x),
                    "mean": float(np.mean(x)) if len(x) else float("nan"),
                    "p50": float(np.median(x)) if len(x) else float("nan"),
                    "share_above": share,
                }
            )
            if share >= min_share:
                saturated[users].append((host, metric))
        saturated[users].sort(key=lambda hm: is_soft(hm[1]))  # hardware first (SOFT_RESOURCES)
    return WhiteBox(
        density=pa.table(dens_rows, schema=DENSITY_SCHEMA),
        shares=pa.Table.from_pylist(share_rows, schema=SHARES_SCHEMA),
        saturated=saturated,
    )


def density_peaks(dens: np.ndarray, grid: np.ndarray = GRID, min_height: float = 0.1) -> list[float]:
    """Utilisation values of the local maxima of a density that reach `min_height` of its maximum."""
    d = np.asarray(dens)
    if d.max() <= 0:
        return []
    inner = (d[1:-1] > d[:-2]) & (d[1:-1] >= d[2:])
    peaks = [int(i) + 1 for i in np.flatnonzero(inner) if d[i + 1] >= min_height * d.max()]
    if d[0] > d[1] and d[0] >= min_height * d.max():
        peaks.insert(0, 0)
    if d[-1] > d[-2] and d[-1] >= min_height * d.max():
        peaks.append(len(d) - 1)
    return [float(grid[i]) for i in peaks]


# --- the cross-check of a fine-grained verdict ------------------------------------------------


@dataclass(frozen=True)
class SaturatedResource:
    """One saturated resource of a host: its metric, the resource it measures and its share above 95 %."""

    host: str
    metric: str
    resource: str
    share_above: float


def saturated_in_tiers(
    shares: pa.Table,
    tiers: Iterable[str],
    users: float,
    host_tiers: Mapping[str, str] | None = None,
    min_share: float = MIN_SHARE,
) -> dict[str, list[SaturatedResource]]:
    """For each of `tiers` (e.g. the tiers of a fine-grained verdict), the white-box resources of its
    hosts saturated at workload level `users`: share above 95 % ≥ `min_share` in `shares` (the
    `WhiteBox.shares` table). A host's tier comes from `host_tiers`, else from its name
    (`tier_of_host`: db2 -> db). Most saturated first; a tier with none maps to []."""

    wanted = list(dict.fromkeys(tiers))
    out: dict[str, list[SaturatedResource]] = {t: [] for t in wanted}
    for r in shares.to_pylist():
        if r["users"] != float(users) or r["share_above"] < min_share:
            continue
        tier = (host_tiers or {}).get(r["host"]) or tier_of_host(r["host"])
        if tier in out:
            out[tier].append(SaturatedResource(r["host"], r["metric"], resource_of(r["metric"]), r["share_above"]))
    for items in out.values():
        items.sort(key=lambda s: (-s.share_above, s.host, s.metric))
    return out


def bound_words(tier: str, saturated: Sequence[SaturatedResource]) -> str:
    """ "db, disk-bound" (resources in order of first appearance, "db, disk- and CPU-bound" for two or
    more); the tier alone when nothing of it was saturated."""
    names = list(dict.fromkeys(s.resource for s in saturated))
    if not names:
        return tier
    if len(names) == 1:
        return f"{tier}, {names[0]}-bound"
    return f"{tier}, " + ", ".join(f"{n}-" for n in names[:-1]) + f" and {names[-1]}-bound"


# --- one host at two grains -------------------------------------------------------------------


@dataclass(frozen=True)
class TwoGrains:
    """One host's utilisation at the sampling grain and re-aggregated to a coarse grain.

    `fine`: ts_ns, value (the samples as recorded); `coarse`: ts_ns (end of each coarse interval),
    value (time-weighted mean of the fine samples in it), samples; the shares are of samples at or
    above the threshold at each grain."""

    host: str
    metric: str
    fine_interval_ns: int
    coarse_interval_ns: int
    fine: pa.Table
    coarse: pa.Table
    fine_share_above: float
    coarse_share_above: float


def two_grains(
    resources: pa.Table,
    host: str,
    metric: str = "cpu_util",
    coarse_ns: int = 1_000_000_000,
    threshold: float = SATURATION_THRESHOLD,
) -> TwoGrains:
    """`host`'s `metric` (a percent metric, or the derived ``cpu``) at its own sampling interval and
    re-aggregated to `coarse_ns` from the same samples.

    A sample covers the interval since the previous one (the monitor's rows are values over the
    interval ending at `ts_ns`); the first sample is taken to cover one median interval. Coarse
    intervals start at the start of the first sample; each gets the time-weighted mean of the fine
    samples that end in it (at 50 ms and 1 s: the mean of its 20 samples). A last coarse interval
    covered for less than half its length is left out."""
    t = resources.sort_by([("ts_ns", "ascending")]) if resources.num_rows else resources
    if metric == "cpu" and not _has(t, host, "cpu"):
        samples = utilisation_samples(t.filter(pc.equal(t.column("host"), host)))
        sel = t.filter(pc.and_(pc.equal(t.column("host"), host), pc.equal(t.column("metric"), "cpu_user")))
        ts = np.unique(sel.column("ts_ns").to_numpy(zero_copy_only=False))
        values = samples.get((host, "cpu"), np.zeros(0))
    else:
        sel = t.filter(pc.and_(pc.equal(t.column("host"), host), pc.equal(t.column("metric"), metric)))
        ts = sel.column("ts_ns").to_numpy(zero_copy_only=False).astype(np.int64)
        values = sel.column("value").to_numpy(zero_copy_only=False).astype(float)
    if len(ts) < 2 or len(ts) != len(values):
        raise ValueError(
            f"two grains: {host} {metric}: expected at least two samples in the resources table, got {len(values)}"
        )
    ts = np.asarray(ts, np.int64)
    fine_interval = int(np.median(np.diff(ts)))
    if coarse_ns < 2 * fine_interval:
        raise ValueError(
            f"two grains: the coarse interval ({coarse_ns / 1e9:g} s) must be at least twice the "
            f"sampling interval of {host} {metric} ({fine_interval / 1e9:g} s)"
        )
    dt = np.diff(np.concatenate([[ts[0] - fine_interval], ts])).astype(float)
    start = ts[0] - fine_interval
    k = (ts - start - 1) // coarse_ns  # a sample ending exactly at a boundary belongs to the interval it ends
    n_bins = int(k.max()) + 1
    weight = np.bincount(k, weights=dt, minlength=n_bins)
    total = np.bincount(k, weights=dt * values, minlength=n_bins)
    count = np.bincount(k, minlength=n_bins)
    keep = weight >= 0.5 * coarse_ns
    keep[:-1] |= weight[:-1] > 0  # only the last interval may be partial
    keep &= count > 0
    coarse_values = total[keep] / weight[keep]
    coarse_ts = start + (np.flatnonzero(keep) + 1) * coarse_ns
    fine = pa.table({"ts_ns": pa.array(ts, pa.int64()), "value": pa.array(values, pa.float64())})
    coarse = pa.table({"ts_ns": pa.array(coarse_ts.astype(np.int64), pa.int64()),
                       "value": pa.array(coarse_values, pa.float64()),
                       "samples": pa.array(count[keep].astype(np.int64), pa.int64())})  # fmt: skip
    return TwoGrains(
        host=host,
        metric=metric,
        fine_interval_ns=fine_interval,
        coarse_interval_ns=int(coarse_ns),
        fine=fine,
        coarse=coarse,
        fine_share_above=float(np.mean(values >= threshold)),
        coarse_share_above=float(np.mean(coarse_values >= threshold)) if len(coarse_values) else 0.0,
    )


def _has(t: pa.Table, host: str, metric: str) -> bool:
    return bool(pc.any(pc.and_(pc.equal(t.column("host"), host), pc.equal(t.column("metric"), metric))).as_py())
