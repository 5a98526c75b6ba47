"""The bottleneck map over a grid of configurations (seed 000 §3, Fig. 2 and Fig. 3).

For each configuration (a topology such as ``1/2/1/2M``) the experiment gives a maximum
throughput (black-box) and, at the workload level of that maximum, each resource's share of time
above 95 % utilisation (white-box). From these:

* the **primary bottleneck** of a configuration is the resource with the largest share above 95 %
  at its maximum-throughput level, provided that share reaches `min_share` (default 0.5, the
  "majority of values in the top five percent" of seed 000); else the configuration has *no
  saturated resource* (seed 001's case: look at the fine-grained analysis). Any utilisation the
  white box has counts: CPU, the CPU quota, disk, memory, sockets (`whitebox.resource_of`); the map
  names it as users read it, "<tier> <resource>" ("db CPU quota", "db disk"), with the tier and the
  resource in columns of their own and the metric it was read from in `bottleneck_metric`
  ("db cpu_quota");
* **saturated per tier**: every tier's saturated resources in one column ("db: disk; app: CPU"),
  so a configuration whose database is disk-bound and whose app server is socket-bound says both;
* **groups** of configurations with similar maximum throughput: sort by maximum throughput and
  start a new group wherever the next value exceeds the previous one by more than `tolerance`
  (relative, default 10 %). Seed 000 reads its three groups off Fig. 3 this way: moving from one
  group to the next (adding a database server, then an application server) raises throughput;
  within a group adding servers does not.

A resource's host name maps to its tier by its prefix (``db2`` -> ``db``, ``mw1`` -> ``middleware``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from tierscope.analysis.whitebox import hardware_first, resource_of
from tierscope.spec import parse_notation
from tierscope.tiers import tier_of_host


@dataclass(frozen=True)
class ConfigurationResult:
    """One configuration of the grid: its topology, maximum throughput, and the share of time above
    95 % of each resource ``(host, metric)`` at the maximum-throughput level."""

    config: str
    max_throughput: float
    shares: Mapping[tuple[str, str], float] = field(default_factory=dict)
    #: servers per tier (web, app, middleware, db) when known; else read from the `#W/#A/#C/#D` notation
    #: the configuration starts with
    counts: Mapping[str, int | None] | None = None


def primary_bottleneck(shares: Mapping[tuple[str, str], float], min_share: float = 0.5) -> tuple[str | None, float]:
    """``("<tier> <metric>", share)`` of the most saturated resource (a software limit only when
    no hardware resource is saturated: `whitebox.hardware_first`), or ``(None, best share)`` (the
    metric's name: the map's `bottleneck_metric`)."""
    if not shares:
        return None, 0.0
    (host, metric), share = _most_saturated(shares, min_share)
    if share < min_share:
        return None, float(share)
    return f"{tier_of_host(host)} {metric}", float(share)


def _most_saturated(shares: Mapping[tuple[str, str], float], min_share: float) -> tuple[tuple[str, str], float]:
    """The ``(host, metric)`` most often above 95 % and its share, the hardware first."""
    return max(hardware_first(shares, min_share).items(), key=lambda kv: (kv[1], kv[0]))


def throughput_groups(max_throughput: Mapping[str, float], tolerance: float = 0.10) -> dict[str, int]:
    """Group numbers (1 = lowest throughput) of configurations with similar maximum throughput."""
    items = sorted(max_throughput.items(), key=lambda kv: kv[1])
    groups: dict[str, int] = {}
    group, previous = 0, None
    for config, x in items:
        if previous is None or x > previous * (1.0 + tolerance):
            group += 1
        groups[config] = group
        previous = x
    return groups


def _counts(r: ConfigurationResult) -> dict[str, int | None]:
    if r.counts is not None:
        return {t: r.counts.get(t) for t in ("web", "app", "middleware", "db")}

    try:
        parsed = parse_notation(r.config.split()[0] if r.config.strip() else r.config)
    except ValueError:  # a name, not #W/#A/#C/#D notation: the map works without grid coordinates
        return {"web": None, "app": None, "middleware": None, "db": None}
    return {t: parsed[t]["count"] for t in ("web", "app", "middleware", "db")}


def saturated_per_tier(shares: Mapping[tuple[str, str], float], min_share: float = 0.5) -> dict[str, list[str]]:
    """tier -> its saturated resources ("disk", "CPU quota", ...), most saturated first."""
    out: dict[str, list[str]] = {}
    for (host, metric), share in sorted(shares.items(), key=lambda kv: (-kv[1], kv[0])):
        if share >= min_share:
            names = out.setdefault(tier_of_host(host), [])
            if resource_of(metric) not in names:
                names.append(resource_of(metric))
    return out


MAP_SCHEMA = pa.schema(
    [
        ("config", pa.string()),
        ("web", pa.int64()),
        ("app", pa.int64()),
        ("middleware", pa.int64()),
        ("db", pa.int64()),
        ("max_throughput", pa.float64()),
        ("bottleneck", pa.string()),
        ("bottleneck_share", pa.float64()),
        ("group", pa.int64()),
        ("tier", pa.string()),
        ("resource", pa.string()),
        ("saturated", pa.string()),
        ("bottleneck_metric", pa.string()),
    ]
)


def bottleneck_map(results: Sequence[ConfigurationResult], tolerance: float = 0.10, min_share: float = 0.5) -> pa.Table:
    """One row per configuration: server counts, maximum throughput, primary bottleneck ("<tier>
    <resource>": "db CPU quota"; its tier and resource apart; "<tier> <metric>" in
    `bottleneck_metric`: "db cpu_quota"), every tier's saturated resources, group."""
    groups = throughput_groups({r.config: r.max_throughput for r in results}, tolerance)
    rows = []
    for r in results:
        name, share = primary_bottleneck(r.shares, min_share)
        tier = resource = None
        if name is not None:
            (host, metric), _ = _most_saturated(r.shares, min_share)
            tier, resource = tier_of_host(host), resource_of(metric)
        per_tier = saturated_per_tier(r.shares, min_share)
        rows.append(
            {
                "config": r.config,
                **_counts(r),
                "max_throughput": float(r.max_throughput),
                "bottleneck": f"{tier} {resource}" if name is not None else None,
                "bottleneck_share": share,
                "group": groups[r.config],
                "tier": tier,
                "resource": resource,
                "saturated": "; ".join(f"{t}: {', '.join(n)}" for t, n in per_tier.items()) or None,
                "bottleneck_metric": name,
            }
        )
    return pa.Table.from_pylist(rows, schema=MAP_SCHEMA)
