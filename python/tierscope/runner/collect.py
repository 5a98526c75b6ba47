"""The end of a point: stop what runs (interference, monitor, capture, the services in reverse) and
gather its tables: events, the capture traced into requests and linked, the servers' logs."""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tierscope import assembly, tables
from tierscope.apps import provider
from tierscope.runner.point import PointContext
from tierscope.services.middleware import Middleware
from tierscope.trace.link import link_file
from tierscope.trace.run import TraceError, trace_capture
from tierscope.trace.servermap import ServerEntry, write_server_map


def collect(ctx: PointContext) -> dict:
    """Stop what runs and gather every table of the point; returns counts per table."""
    counts: dict[str, int] = {}
    if ctx.interference is not None:
        ctx.events.append(ctx.interference.stop())
        ctx.interference = None
    if ctx.monitor is not None:
        ctx.monitor.stop()
        ctx.monitor = None
    if ctx.activity is not None:
        add_resources(ctx.dir / "resources.parquet", ctx.activity.stop())
        ctx.notes += ctx.activity.notes()
        ctx.activity = None
    if ctx.capture is not None:
        ctx.capture.stop()
        ctx.capture = None
    stop_services(ctx)
    ev_dir = ctx.dir / "app-events"
    if ev_dir.exists():
        app = provider(ctx.point.config.benchmark)
        for d in sorted(ev_dir.iterdir()):
            ctx.events.append(app.events(d))
    events = (
        pa.concat_tables([tables.conform(t, "events") for t in ctx.events]) if ctx.events else tables.empty("events")
    )
    tables.write(events, ctx.dir / "events.parquet", "events")
    counts["events"] = events.num_rows
    pcap = ctx.dir / "capture.pcap"
    if pcap.exists():
        counts["requests"] = trace_point_capture(ctx, pcap)
    for name in ("client_requests", "resources"):
        f = ctx.dir / f"{name}.parquet"
        if f.exists():
            counts[name] = pq.read_metadata(f).num_rows
    return counts


def add_resources(path: Path, rows: pa.Table) -> None:
    """Append resources rows (`runner.activity`'s) to the point's resources table."""
    if rows.num_rows == 0:
        return
    if path.exists():
        rows = pa.concat_tables([tables.conform(pq.read_table(path), "resources"), rows])
    tables.write(rows.sort_by([("ts_ns", "ascending")]), path, "resources")


def trace_point_capture(ctx: PointContext, pcap: Path) -> int:
    """The capture traced into requests.parquet with the point's server map; returns the rows."""
    entries = []
    for address, tier, name, proto in ctx.server_map:
        addr, port = address.rsplit(":", 1)
        entries.append(ServerEntry(addr, int(port), tier, name, proto))
    smap = write_server_map(entries, ctx.dir / "servers.map")
    try:
        result = trace_capture(pcap, ctx.dir / "requests.parquet", smap)
    except TraceError as err:
        ctx.notes.append(f"tracing the capture failed: {err}")
        return 0
    (ctx.dir / "trace.json").write_text(json.dumps(result.stats, indent=1))
    if result.damaged:
        ctx.notes.append(
            f"the capture is damaged part way: {result.stopped_early}; only its first {result.packets} packets were traced"
        )
    elif result.stopped_early:
        ctx.notes.append(f"the capture was read partly: {result.stopped_early}")
    link_point_requests(ctx)
    return pq.read_metadata(ctx.dir / "requests.parquet").num_rows


def link_point_requests(ctx: PointContext) -> None:
    """Link the traced rows into transactions (`tierscope.trace.link.link_file`: by request id —
    X-Request-Id at web and app, sqlcommenter request_id on SQL — else by time containment on the
    caller's host), so the analysis can compute exclusive load. The counts per link kind go to
    trace.json under "links"."""
    path = ctx.dir / "requests.parquet"
    try:
        if pq.ParquetFile(path).metadata.num_rows == 0:
            return
        kinds = link_file(path)
    except Exception as err:  # the unlinked table stays; the analysis then uses inclusive load
        ctx.notes.append(f"linking the traced requests failed: {err}")
        return
    stats_file = ctx.dir / "trace.json"
    stats = json.loads(stats_file.read_text()) if stats_file.exists() else {}
    stats["links"] = kinds
    stats_file.write_text(json.dumps(stats, indent=1))


def note_disabled_backends(ctx: PointContext, middleware) -> None:
    """A middleware that disabled a database server (a failed write the others executed) leaves
    the replicas out of sync for the rest of the point, and one that came back (rejoined once its
    recovery log brought it to the head) was out for part of it: say so in the manifest's notes."""
    try:
        stats = json.loads(middleware.stats_path.read_text())
    except (OSError, ValueError) as err:
        ctx.notes.append(f"{middleware.name}: no counts written on exit ({err})")
        return
    for b in stats.get("backends", []):
        if not b.get("enabled", True):
            ctx.notes.append(f"{middleware.name} disabled database backend {b['name']}: {b.get('disabled_reason')}")
        if b.get("rejoined"):
            ctx.notes.append(
                f"{middleware.name}: database backend {b['name']} stopped answering and rejoined "
                f"{b['rejoined']} time(s) during the point (replayed from the recovery log first)"
            )


def stop_services(ctx: PointContext) -> None:
    """Stop what the point started (the assembly's stop path, the last started first), then keep
    the servers' logs and drop their copies of the data."""
    assembly.RunningSystem(services=ctx.services).stop(
        on_error=lambda svc, err: ctx.notes.append(f"stopping {svc.name}: {err}")
    )
    for svc in ctx.services:
        if isinstance(svc, Middleware):
            note_disabled_backends(ctx, svc)
        logs_dir = ctx.dir / "logs" / svc.name
        for name, path in svc.logs().items():
            logs_dir.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):
                shutil.copy(path, logs_dir / f"{name}.log")
        data_dir = getattr(svc, "data_dir", None)
        if data_dir is not None:  # a copy of the snapshot: not a result, and large at paper scale
            shutil.rmtree(data_dir, ignore_errors=True)
            shutil.rmtree(svc.workdir / "sock", ignore_errors=True)
    ctx.services = []
