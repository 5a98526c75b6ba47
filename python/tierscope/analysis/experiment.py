"""The analysis entry point: every analysis of a run directory or of plain trace files, computed once,
as one `Analysis` the report renders.

`analyze_run` reads ``DIR/<run>/<point>/`` (see `tierscope.analysis.points`), groups points by
configuration, and runs the black-box (per configuration), white-box (per configuration), bottleneck
map (when there are two or more configurations), heavy-request and fine-grained analyses. The
fine-grained analysis runs on one point: the one asked for, else the first point at or above the
knee of its configuration (seed 004: look inside the system just past the knee) — or, when that
point shows no saturated tier, the next higher level that does — else the point with the most
users. `analyze_files` imports trace files and runs the fine-grained and heavy
analyses only. What cannot be computed is left None with a note saying why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tierscope.analysis.alternation import Verdict
from tierscope.analysis.blackbox import BlackBox, blackbox, load_curve
from tierscope.analysis.bottleneck_map import ConfigurationResult, bottleneck_map
from tierscope.analysis.fine import MIN_IDLE_ARRIVALS, analyze_fine, idle_service_times
from tierscope.analysis.heavy import heavy_requests, heavy_summary, stall_events
from tierscope.analysis.points import Point, find_points
from tierscope.analysis.study import configuration_labels
from tierscope.analysis.whitebox import WhiteBox, whitebox
from tierscope.contracts import DEFAULT_WINDOW_NS
from tierscope.ingest import ImportResult, load
from tierscope.trace.link import link_transactions, rows_linked_to_their_own_id


@dataclass
class Analysis:
    """What the analyses of a run or of trace files found (see the module docstring); None means "no
    data", with a note."""

    title: str
    window_ns: int = DEFAULT_WINDOW_NS
    requests: pa.Table | None = None  # of the point the fine-grained analysis ran on
    fine: Any | None = None  # tierscope.analysis.fine.FineGrained
    fine_point: str | None = None
    fine_users: float | None = None  # the workload level of that point
    blackbox: dict[str, BlackBox] = field(default_factory=dict)  # configuration -> curve, knee
    whitebox: dict[str, WhiteBox] = field(default_factory=dict)
    focus_config: str | None = None
    #: configuration -> its topology and swept fields but the workload level, in the sweep's order
    configurations: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: configuration -> its name by what differs between the configurations ("db memory 150 MiB")
    labels: dict[str, str] = field(default_factory=dict)
    bmap: pa.Table | None = None
    heavy: pa.Table | None = None
    heavy_summary: pa.Table | None = None
    stalls: pa.Table | None = None  # analysis.heavy.stall_events: requests held by a stopped server
    resources: pa.Table | None = None  # the resources table of the analysed point, if any
    truth: pa.Table | None = None  # the simulator's saturation_truth of the analysed point, if any
    imported: ImportResult | None = None
    points: list[Point] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def run_fine(
    requests: pa.Table, events: pa.Table | None, window_ns: int, service_hints: dict[str, float] | None = None
) -> tuple[Any | None, str | None]:
    """The fine-grained analysis of the server tiers (the client tier is left out), or why not."""
    servers = requests.filter(pc.not_equal(requests.column("tier"), "client"))
    if servers.num_rows == 0:
        return None, "no requests at any server tier (only the client's own log)"
    fine = analyze_fine(servers, events=events, window_ns=window_ns, service_hints=service_hints)
    notes = list(getattr(fine, "notes", None) or [])
    return fine, ("; ".join(notes) if notes else None)


def _heavy(data: Analysis, requests: pa.Table) -> None:
    n_star = {s: ns.n_star for s, ns in data.fine.n_star.items()} if data.fine is not None else None
    try:
        h = heavy_requests(requests, n_star=n_star)
        data.stalls = stall_events(requests, n_star=n_star)
    except Exception as err:  # an analysis failing must not take the report down
        data.notes.append(f"heavy requests not computed: {err}")
        return
    data.heavy = h
    data.heavy_summary = heavy_summary(requests, h) if h.num_rows else None


def analyze_files(
    paths: Sequence[str | Path],
    format: str | None = None,
    window_ns: int = DEFAULT_WINDOW_NS,
    events: pa.Table | None = None,
    resources: pa.Table | None = None,
    imported: ImportResult | None = None,
    **options: Any,
) -> Analysis:
    """Import trace files and analyse them (fine grain and heavy requests). `events` (the events
    table: GC, injected pauses) feed the pause detection, `resources` (the resources table) the
    white box at this one workload level. `imported`: the files already imported."""
    result = imported if imported is not None else load(paths, format, **options)
    data = Analysis(
        title=", ".join(Path(p).name for p in paths),
        window_ns=window_ns,
        imported=result,
        requests=result.requests,
        resources=resources,
    )
    data.notes.extend(result.notes)
    if resources is not None and resources.num_rows:
        data.whitebox["(this system)"] = whitebox([(0.0, resources)])
        data.focus_config = "(this system)"
    if result.requests.num_rows == 0:
        data.notes.append("no requests were imported")
        return data
    data.fine, why = run_fine(result.requests, events, window_ns)
    if why:
        data.notes.append(why)
    _heavy(data, result.requests)
    data.notes.append(
        "workload-level analyses (load curve, knee, utilisation densities, bottleneck map) need a "
        "run directory with several points; plain trace files have one"
    )
    return data


def _point_requests(point: Point, notes: list[str]) -> pa.Table | None:
    """The point's requests; a table linked by an older tierscope (rows naming their own request id as
    parent) is linked again, once, and `notes` says so."""

    if not point.tables.rows("requests"):
        return None
    reqs = point.tables["requests"]
    ambiguous = rows_linked_to_their_own_id(reqs)
    if ambiguous:
        reqs = link_transactions(reqs)
        point.tables["requests"] = reqs
        notes.append(
            f"point {point.name}: requests.parquet was linked by an older tierscope ({ambiguous} rows name "
            "their own request id as parent, which their parent and siblings carry too); linked again for this analysis"
        )
    return reqs


def analyze_run(
    root: str | Path, window_ns: int = DEFAULT_WINDOW_NS, point: str | None = None, think_time_s: float | None = None
) -> Analysis:
    """Read every point under `root` and run all analyses (see the module docstring)."""
    root = Path(root)
    points = find_points(root)
    if not points:
        raise FileNotFoundError(
            f"{root}: no experiment points found (expected <point>/manifest.json or "
            f"<point>/requests.parquet up to three levels below)"
        )
    failed = [p for p in points if p.manifest.status == "failed"]
    points = [p for p in points if p.manifest.status != "failed"]
    if not points:
        raise FileNotFoundError(f"{root}: every point failed; nothing to report")
    data = Analysis(title=root.name, window_ns=window_ns, points=points)
    for p in failed[:5]:
        data.notes.append(f"point {p.name} failed ({p.manifest.reason or 'no reason given'}) and is left out")
    if len(failed) > 5:
        data.notes.append(f"{len(failed) - 5} more failed points are left out")
    by_config: dict[str, list[Point]] = {}
    for p in points:
        by_config.setdefault(p.config or "(this system)", []).append(p)
    data.configurations, data.labels = configurations_of(by_config)
    for config, pts in by_config.items():
        levels = [p for p in pts if p.users is not None]
        curve_pts: list[tuple[float, pa.Table, float]] = []
        for p in levels:
            reqs = p.tables.get("client_requests")
            if reqs is None or reqs.num_rows == 0:
                reqs = p.tables.front_tier("web")
            if reqs is not None and reqs.num_rows:
                # a point without a run interval measures over its requests' span (point_summary)
                curve_pts.append((_level(p), reqs, cast(float, p.seconds)))
        if len(curve_pts) >= 1:
            think = (
                think_time_s
                if think_time_s is not None
                else next((p.think_time_s for p in levels if p.think_time_s is not None), None)
            )
            data.blackbox[config] = blackbox(load_curve(curve_pts), think_time_s=think)
        res_pts = [(_level(p), p.tables["resources"]) for p in levels if "resources" in p.tables]
        if res_pts:
            data.whitebox[config] = whitebox(res_pts)
    if not data.blackbox:
        data.notes.append(
            "no load curve: the points have no workload level (users) in manifest.json or no "
            "client_requests/web requests"
        )
    if not data.whitebox:
        data.notes.append("no utilisation densities: no resources.parquet with percent metrics at any point")

    # the bottleneck map: one row per configuration with a maximum throughput, in the sweep's order
    results = []
    sweep_order = {c: i for i, c in enumerate(data.configurations)}
    for config in sorted(data.blackbox, key=lambda c: sweep_order.get(c, len(sweep_order))):
        bb = data.blackbox[config]
        shares: dict[tuple[str, str], float] = {}
        wb = data.whitebox.get(config)
        if wb is not None and wb.shares.num_rows:
            for row in wb.shares.to_pylist():
                if row["users"] == bb.max_throughput_users:
                    shares[(row["host"], row["metric"])] = row["share_above"]
        tiers = next((p.manifest.tiers for p in by_config[config] if p.manifest.tiers), None)
        results.append(ConfigurationResult(config, bb.max_throughput, shares, counts=tiers))
    if len(results) >= 2:
        data.bmap = bottleneck_map(results)
    elif len(by_config) < 2:
        data.notes.append("no bottleneck map: it compares configurations, and this run has one")

    # the point for the fine-grained analysis
    chosen: Point | None = None
    if point is not None:
        chosen = next((p for p in points if p.name == point or str(p.path).endswith(point)), None)
        if chosen is None:
            raise ValueError(f"no point named {point!r}; points: {', '.join(p.name for p in points)}")
    else:
        with_requests = [p for p in points if p.tables.rows("requests")]
        first = next(iter(data.blackbox), None)
        knee = data.blackbox[first].knee if first else None
        if knee is not None:
            above = [
                p
                for p in with_requests
                if (p.config or "(this system)") == first and p.users is not None and p.users >= knee.users
            ]
            chosen = min(above, key=_level) if above else None
        if chosen is None and with_requests:
            chosen = max(with_requests, key=lambda p: (p.users or 0, p.name))
    if chosen is not None:
        data.focus_config = chosen.config or "(this system)"
        reqs = _point_requests(chosen, data.notes)
        if reqs is None:
            data.notes.append(f"point {chosen.name} has no requests table: no fine-grained analysis")
        else:
            _analyse_point(data, chosen, reqs, window_ns, points)
            if point is None:
                _past_a_quiet_knee(data, chosen, points, window_ns)
    else:
        data.notes.append("no point has a requests table: no fine-grained analysis")
        data.focus_config = next(iter(data.whitebox), None)
    return data


def configurations_of(by_config: dict[str, list[Point]]) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Each configuration's fields (its topology and swept values but the workload level, from its
    first point's manifest), in the sweep's order (its points' lowest index), and its label by what
    differs (`analysis.study.configuration_labels`)."""

    def order(item: tuple[str, list[Point]]) -> tuple[int, str]:
        indexes = [p.manifest.point.index for p in item[1] if p.manifest.point.index is not None]
        return (min(indexes) if indexes else 1 << 30, item[0])

    configs: dict[str, dict[str, Any]] = {}
    for config, pts in sorted(by_config.items(), key=order):
        m = pts[0].manifest
        fields: dict[str, Any] = {"topology": m.topology} if m.topology else {}
        fields.update({k: v for k, v in m.point.params.items() if k not in ("workload.users", "topology")})
        if "topology" in m.point.params:
            fields["topology"] = m.point.params["topology"]
        configs[config] = fields
    values = [c if c else {"configuration": name} for name, c in configs.items()]
    return configs, dict(zip(configs, configuration_labels(values)))


def _level(p: Point) -> float:
    """The workload level of a point the caller kept for having one (`users` is not None)."""
    if p.users is None:
        raise ValueError(f"point {p.name}: no workload level (users)")
    return p.users


def service_hints(chosen: Point, points: list[Point], notes: list[str], limit: int = 3) -> dict[str, float]:
    """Per server, its service time measured at the nearest lower workload levels of the same
    configuration (requests that found it idle): the slope of the main sequence of a server that
    was saturated during the whole analysed point and so never found idle there."""

    if chosen.users is None:
        return {}
    lower = sorted(
        (
            p
            for p in points
            if p.config == chosen.config
            and p.users is not None
            and p.users < chosen.users
            and p.tables.rows("requests")
        ),
        key=lambda p: -_level(p),
    )
    hints: dict[str, float] = {}
    for p in lower[:limit]:
        reqs = _point_requests(p, notes)
        if reqs is None:
            continue
        reqs = reqs.filter(pc.not_equal(reqs.column("tier"), "client"))
        try:
            measured = idle_service_times(reqs, p.tables.get("events"))
        except Exception:  # a hint is optional: the analysis works without it
            continue
        for server, (s, n) in measured.items():
            if server not in hints and n >= MIN_IDLE_ARRIVALS and s > 0:
                hints[server] = s
    return hints


def _analyse_point(
    data: Analysis, chosen: Point, reqs: pa.Table, window_ns: int, points: list[Point] | None = None
) -> None:
    data.requests = reqs
    data.resources = chosen.tables.get("resources")
    data.fine_users = chosen.users
    data.fine_point = f"{chosen.config + ' ' if chosen.config else ''}{chosen.name}" + (
        f" ({chosen.users:g} users)" if chosen.users is not None else ""
    )
    truth = chosen.path / "saturation_truth.parquet"
    data.truth = None
    if truth.is_file():
        data.truth = pq.read_table(truth)
    data.fine, why = run_fine(reqs, chosen.tables.get("events"), window_ns)
    if (
        data.fine is not None
        and points
        and any("found the server idle" not in ns.method for ns in data.fine.n_star.values())
    ):
        hints = service_hints(chosen, points, data.notes)
        if hints:
            data.fine, why = run_fine(reqs, chosen.tables.get("events"), window_ns, service_hints=hints)
    if why:
        data.notes.append(why)
    missing = untraced_tiers(chosen.manifest.tiers, reqs)
    if missing and data.fine is not None:
        data.fine = dataclasses.replace(data.fine, verdict=without_tiers(data.fine.verdict, missing))
        data.notes.append(f"no request traced at {', '.join(missing)}: {UNTRACED_WHY}")
    _heavy(data, reqs)


#: The confidence cap of a verdict on a system some of whose tiers have no traced request.
UNTRACED_CAP = 0.45
UNTRACED_WHY = "the capture saw none of its traffic, so its saturation cannot be judged"


def untraced_tiers(topology: dict[str, int] | None, requests: pa.Table) -> list[str]:
    """The tiers the run's topology has servers in (manifest `tiers`) with no row in `requests`."""
    if not topology:
        return []
    seen = set(requests.column("tier").unique().to_pylist()) if requests.num_rows else set()
    return sorted(t for t, n in topology.items() if n and t not in seen)


def without_tiers(verdict: Verdict, missing: list[str]) -> Verdict:
    """`verdict` with at most UNTRACED_CAP, saying which tiers it could not weigh."""
    return dataclasses.replace(
        verdict,
        confidence=min(verdict.confidence, UNTRACED_CAP),
        evidence=f"{verdict.evidence}; no request traced at {', '.join(missing)}: {UNTRACED_WHY}",
    )


def _past_a_quiet_knee(data: Analysis, chosen: Point, points: list[Point], window_ns: int) -> None:
    """When the point at the knee shows no saturated tier (a knee is where queues *start* to grow),
    analyse the next workload levels of the same configuration, in order, until one does."""
    verdict = getattr(data.fine, "verdict", None)
    if verdict is None or verdict.kind != "none" or chosen.users is None:
        return
    higher = sorted(
        (
            p
            for p in points
            if p.config == chosen.config
            and p.users is not None
            and p.users > chosen.users
            and p.tables.rows("requests")
        ),
        key=_level,
    )
    for p in higher:
        reqs = _point_requests(p, data.notes)
        if reqs is None:
            continue
        _analyse_point(data, p, reqs, window_ns, points)
        if data.fine is not None and data.fine.verdict.kind != "none":
            data.notes.append(
                f"the point at the knee ({chosen.name}, {chosen.users:g} users) showed no saturated "
                f"tier: the fine-grained analysis is of the next level with one, {p.name} "
                f"({p.users:g} users)"
            )
            return
    if higher:
        data.notes.append(f"no saturated tier at the knee ({chosen.users:g} users) nor at any higher level")
