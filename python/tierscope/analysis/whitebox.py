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

Utilisation metrics are the `resources` rows with unit ``percent``; ``cpu_user`` + ``cpu_system``
of the same host and sample time are also summed into a derived ``cpu`` metric (capped at 100) when a
host reports both and no ``cpu`` of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

GRID = np.linspace(0.0, 100.0, 201)  # 0.5 percentage-point steps
SATURATION_THRESHOLD = 95.0
MIN_SHARE = 0.5


@dataclass(frozen=True)
class WhiteBox:
    """Densities (users, host, metric, util, density), shares (users, host, metric, samples, mean,
    p50, share_above), and the saturated resources per level."""

    density: pa.Table
    shares: pa.Table
    saturated: dict[float, list[tuple[str, str]]]


def utilisation_samples(resources: pa.Table) -> dict[tuple[str, str], np.ndarray]:
    """(host, metric) -> utilisation samples in percent, with the derived `cpu` = user + system."""
    t = resources.filter(pc.equal(resources.column("unit"), "percent"))
    out: dict[tuple[str, str], list] = {}
    hosts = t.column("host").to_pylist()
    metrics = t.column("metric").to_pylist()
    values = t.column("value").to_numpy(zero_copy_only=False)
    ts = t.column("ts_ns").to_numpy(zero_copy_only=False)
    cpu_parts: dict[tuple[str, int], float] = {}
    for h, m, v, s in zip(hosts, metrics, values, ts):
        out.setdefault((h, m), []).append(v)
        if m in ("cpu_user", "cpu_system"):
            cpu_parts[(h, int(s))] = cpu_parts.get((h, int(s)), 0.0) + float(v)
    both = {h for h, m in out if m == "cpu_user"} & {h for h, m in out if m == "cpu_system"}
    for (h, _s), v in sorted(cpu_parts.items()):
        if h in both and (h, "cpu") not in out:
            out.setdefault((h, "cpu*"), []).append(min(v, 100.0))
    for h in both:
        if (h, "cpu*") in out:
            out[(h, "cpu")] = out.pop((h, "cpu*"))
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
    return dens / area if area > 0 else dens


def whitebox(points: Sequence[tuple[float, pa.Table]], threshold: float = SATURATION_THRESHOLD,
             min_share: float = MIN_SHARE, grid: np.ndarray = GRID) -> WhiteBox:
    """Densities, shares above `threshold` and saturated resources for each ``(users, resources)`` point."""
    dens_rows: dict[str, list] = {"users": [], "host": [], "metric": [], "util": [], "density": []}
    share_rows: list[dict] = []
    saturated: dict[float, list[tuple[str, str]]] = {}
    for users, resources in sorted(points, key=lambda p: p[0]):
        users = float(users)
        saturated.setdefault(users, [])
        for (host, metric), x in sorted(utilisation_samples(resources).items()):
            d = density(x, grid)
            n = len(grid)
            dens_rows["users"] += [users] * n
            dens_rows["host"] += [host] * n
            dens_rows["metric"] += [metric] * n
            dens_rows["util"] += grid.tolist()
            dens_rows["density"] += d.tolist()
            share = float(np.mean(x >= threshold)) if len(x) else 0.0
            share_rows.append({"users": users, "host": host, "metric": metric, "samples": len(x),
                               "mean": float(np.mean(x)) if len(x) else float("nan"),
                               "p50": float(np.median(x)) if len(x) else float("nan"), "share_above": share})
            if share >= min_share:
                saturated[users].append((host, metric))
    shares_schema = pa.schema([("users", pa.float64()), ("host", pa.string()), ("metric", pa.string()),
                               ("samples", pa.int64()), ("mean", pa.float64()), ("p50", pa.float64()),
                               ("share_above", pa.float64())])
    return WhiteBox(
        density=pa.table(dens_rows, schema=pa.schema([("users", pa.float64()), ("host", pa.string()),
                                                      ("metric", pa.string()), ("util", pa.float64()),
                                                      ("density", pa.float64())])),
        shares=pa.Table.from_pylist(share_rows, schema=shares_schema),
        saturated=saturated,
    )


def density_peaks(dens: np.ndarray, grid: np.ndarray = GRID, min_height: float = 0.1) -> list[float]:
    """Utilisation values of the local maxima of a density that reach `min_height` of its maximum."""
    d = np.asarray(dens)
    if d.max() <= 0:
        return []
    inner = (d[1:-1] > d[:-2]) & (d[1:-1] >= d[2:])
    peaks = [i + 1 for i in np.flatnonzero(inner) if d[i + 1] >= min_height * d.max()]
    if d[0] > d[1] and d[0] >= min_height * d.max():
        peaks.insert(0, 0)
    if d[-1] > d[-2] and d[-1] >= min_height * d.max():
        peaks.append(len(d) - 1)
    return [float(grid[i]) for i in peaks]
