"""One point start to finish: build its hosts, start the tiers (the assembly, from the benchmark's
provider), the capture, the monitor and the interference, drive the workload, then tear down in
reverse and collect, always; a point whose tier dies is failed with the reason."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

from tierscope import assembly
from tierscope.apps import provider
from tierscope.runner.activity import ActivitySampler
from tierscope.runner.collect import collect, stop_services
from tierscope.runner.drive import drive
from tierscope.runner.point import DONE, FAILED, PointContext, PointFailed, Progress
from tierscope.runner.record import write_manifest
from tierscope.spec import Point, Spec, db_topology_problem
from tierscope.testbed.lab import Testbed, holders
from tierscope.trace.capture import LiveCapture


def prepare_data(points: list[Point], work: Path, say: Callable[[str], None]) -> dict[tuple, Path]:
    """Load (or reuse) the data every point starts from, once per (benchmark, data key); returns
    the loaded data directories by that key."""
    out: dict[tuple, Path] = {}
    for p in points:
        c = p.config
        app = provider(c.benchmark)
        key = (c.benchmark, *app.data_key(c))
        if key not in out:
            out[key] = app.prepare_data(c, work, say)
    return out


def start_tiers(ctx: PointContext, data_dirs: dict[tuple, Path], progress: Progress) -> str:
    """Start the database server(s), the clustering middleware (if the topology has one), the app
    servers and nginx in their hosts; return the system's URL.

    Every database server starts from the same loaded data. With middleware servers, each one has
    all database servers as backends (RAIDb-1) and the app servers are spread over them round
    robin; without, the one database server serves the app servers directly. The system is put
    together by `tierscope.assembly` from the point's layout; what runs in each tier comes from the
    benchmark's provider (`tierscope.apps`). What starts goes to the point's services, server map
    and notes as it answers, so that teardown stops exactly that."""
    c = ctx.point.config
    app = provider(c.benchmark)
    check_db_topology(c.dbms, len(c.tier_servers("db")), len(c.tier_servers("middleware")))
    system = assembly.RunningSystem(services=ctx.services, servers=ctx.server_map, notes=ctx.notes)
    assembly.assemble(
        app,
        assembly.point_layout(c, ctx.hosts, ctx.dir),
        assembly.point_soft(c),
        data_dir=data_dirs[(c.benchmark, *app.data_key(c))],
        system=system,
        phase=lambda what: setattr(progress, "phase", what),
    )
    return system.url


def socket_limits(c) -> dict[str, int]:
    """Per server, the TCP connections it accepts where the soft resources say so: a database's
    `max_connections`, a web server's workers x `worker_connections` (nginx counts client and
    upstream connections alike). The monitor turns established connections into `sockets_util`."""
    out = {s.name: c.soft.db.max_connections for s in c.tier_servers("db")}
    out.update({s.name: c.soft.web.workers * c.soft.web.connections for s in c.tier_servers("web")})
    return out


def start_activity(ctx: PointContext, interval: float) -> None:
    """Sample the busy sessions of the point's database servers (`runner.activity`) beside the
    monitor; a server whose probe cannot open is left out with a note."""
    probes = {}
    for s in ctx.services:
        open_probe = getattr(s, "busy_sessions_probe", None)
        if open_probe is None:
            continue
        try:
            probes[s.name] = open_probe()
        except Exception as err:
            ctx.notes.append(f"{s.name}: busy connections not sampled ({type(err).__name__}: {err})")
    if probes:
        ctx.activity = ActivitySampler(probes, interval).start()


def check_db_topology(dbms: str, n_db: int, n_middleware: int) -> None:
    """Raise PointFailed for database/middleware combinations the lab cannot run (a spec refuses
    them when it is loaded; this guards configurations built in code)."""
    problem = db_topology_problem(dbms, n_db, n_middleware)
    if problem:
        raise PointFailed(problem)


#: What the lab captures: TCP segments that carry payload or open/close a connection. Pure ACKs
#: (about half the packets of a request/response exchange) tell the tracer nothing, so the kernel
#: drops them before tcpdump has to copy them (the lab's hosts speak IPv4 on the bridge).
CAPTURE_FILTER = (
    "tcp and ((tcp[tcpflags] & (tcp-syn|tcp-fin|tcp-rst) != 0)"
    " or (ip[2:2] - ((ip[0] & 0xf) << 2) - ((tcp[12] & 0xf0) >> 2) != 0))"
)


def start_capture(ctx: PointContext) -> None:
    """tcpdump on the bridge (one clock for every tier), written to capture.pcap."""
    c = ctx.point.config
    if not isinstance(ctx.testbed, Testbed):
        raise RuntimeError("the capture needs the point's testbed (its bridge)")
    ctx.capture = LiveCapture(
        ctx.testbed.capture_interface,
        ctx.dir / "capture.pcap",
        filter=CAPTURE_FILTER,
        snaplen=c.monitor.snaplen,
    ).start()


def check_tiers_alive(ctx: PointContext) -> None:
    """Raise PointFailed naming every tier whose program has died."""
    dead = [s.name for s in ctx.services if not s.running()]
    if dead:
        raise PointFailed(f"tier died during the run: {', '.join(dead)}")


def run_point(
    point: Point, spec: Spec, run_dir: Path, data_dirs: dict, mode: str, progress: Progress, vers: dict
) -> tuple[str, str | None]:
    """Run one point start to finish; always tears down; returns (status, reason)."""
    pdir = run_dir / point.id
    if pdir.exists():
        held = holders([pdir])
        if held:  # a killed run's processes still write there: never delete under them
            who = "; ".join(f"pid {pid} ({what})" for pid, what in sorted(held.items())[:3])
            return FAILED, (
                f"not deleting {pdir}: {len(held)} live process(es) still hold it ({who}); "
                "`tierscope testbed clean --orphans` stops what a killed run left"
            )
        shutil.rmtree(pdir)
    pdir.mkdir(parents=True)
    ctx = PointContext(point, pdir)
    ctx.phases["point_start_ns"] = time.time_ns()
    started = time.monotonic()
    status, reason, counts, summary = FAILED, None, {}, {}
    interrupted = False
    try:
        progress.phase = "building hosts"
        ctx.testbed = Testbed(lab=None, workdir=pdir / "testbed", mode=mode, point_dir=pdir)
        ctx.hosts = ctx.testbed.up(point)
        url = start_tiers(ctx, data_dirs, progress)
        c = point.config
        if c.monitor.capture:
            start_capture(ctx)
        ctx.monitor = ctx.testbed.start_monitor(
            c.monitor.interval,
            pdir / "resources.parquet",
            socket_limits=socket_limits(c),
        )
        start_activity(ctx, c.monitor.interval)
        if c.interference.pause or c.interference.noisy_neighbour:
            pids = {s.name: s.pids for s in ctx.services}
            ctx.interference = ctx.testbed.start_interference(point, seed=point.seed, pids=pids)
        summary = drive(ctx, url, progress)
        check_tiers_alive(ctx)
        status = DONE
    except KeyboardInterrupt:
        interrupted = True
        reason = "interrupted"
    except Exception as err:  # the point fails, the sweep goes on
        reason = f"{type(err).__name__}: {err}"
    finally:
        progress.phase = "collecting"
        try:
            counts = collect(ctx)
        except Exception as err:
            ctx.notes.append(f"collect: {err}")
            if status == DONE:
                status, reason = FAILED, f"collect failed: {err}"
        finally:
            stop_services(ctx)
            if isinstance(ctx.testbed, Testbed):
                try:
                    ctx.testbed.down()
                except Exception as err:
                    ctx.notes.append(f"testbed down: {err}")
        if status == DONE and counts.get("client_requests", 0) == 0:
            status, reason = FAILED, "the generator logged no request"
        if not interrupted:
            write_manifest(ctx, status, reason, spec, counts, summary, vers, time.monotonic() - started)
    if interrupted:
        shutil.rmtree(pdir, ignore_errors=True)  # an unfinished point is not a result
        raise KeyboardInterrupt
    return status, reason
