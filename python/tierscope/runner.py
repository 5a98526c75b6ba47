"""The experiment runner: every point of a spec's sweep, one after the other, start to finish.

For each point: build the hosts (testbed), restore the database from its snapshot, start the
tiers and wait for health, start the capture, the resource monitor and the interference, drive the
workload (ramp-up, run, ramp-down), then stop everything and collect: the generator's log, the
capture traced into `requests`, `resources`, `events`, the servers' logs, and `manifest.json`.
Results go to `OUT/<run>/<point>/`. A point whose tier dies is recorded as failed with the reason
and the sweep goes on; Ctrl-C stops cleanly, keeps finished points and leaves nothing running.
At the end the analysis runs over the whole run and `report.html` is written.

The stages are small functions over a `PointContext`; I/O is here, the analysis is elsewhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tierscope import __version__, assembly, manifest, tables
from tierscope.analysis.experiment import analyze_run
from tierscope.analysis.summary import build_summary
from tierscope.apps import provider
from tierscope.contracts import DEFAULT_WINDOW_NS
from tierscope.engine import engine_version
from tierscope.load import LoadError, engine_args, merge_client_logs, run_load, split_users
from tierscope.report import write_report
from tierscope.services.databases import server_binaries
from tierscope.services.middleware import Middleware
from tierscope.spec import Point, Spec, db_topology_problem, expand
from tierscope.studies import finding_of_run
from tierscope.testbed.lab import Interference, Testbed, find_orphans, free_lab, holders, remove_orphan
from tierscope.testbed.monitor import Monitor
from tierscope.tiers import TIERS
from tierscope.trace.capture import LiveCapture
from tierscope.trace.link import link_file
from tierscope.trace.run import TraceError, trace_capture
from tierscope.trace.servermap import ServerEntry, write_server_map

#: the ports inside the hosts (web, app, middleware; a database server listens on its DBMS's port):
#: the assembly's, named here too for the remote controller
WEB_PORT, APP_PORT, MIDDLEWARE_PORT = assembly.WEB_PORT, assembly.APP_PORT, assembly.MIDDLEWARE_PORT

DONE, FAILED = "done", "failed"


class PointFailed(RuntimeError):
    """A point could not finish (a tier died, a service did not start); the sweep goes on."""


@dataclass
class Progress:
    """What the live display shows; updated by the runner, read by the display thread."""

    points_total: int = 0
    point_index: int = 0
    point_id: str = ""
    phase: str = "starting"
    users: int = 0
    active_users: int = 0
    rps: float = 0.0
    p90_ms: float | None = None
    errors: int = 0
    point_started: float = 0.0
    point_seconds: float = 0.0
    finished: list[tuple[str, str, str]] = field(default_factory=list)  # (id, status, note)
    messages: list[str] = field(default_factory=list)  # the latest few
    messages_said: int = 0  # all messages so far (the list keeps only the latest)

    def say(self, message: str) -> None:
        self.messages.append(message)
        self.messages_said += 1
        del self.messages[:-6]


@dataclass
class Placement:
    """Where a point's hosts are when no local testbed holds them (a `--hosts` run,
    tierscope.remote): the manifest's testbed mode and the hosts lost on the way."""

    mode: str
    lost: list[str] = field(default_factory=list)


@dataclass
class PointContext:
    """Everything one point starts, so that teardown can stop exactly that, in reverse."""

    point: Point
    dir: Path
    testbed: Testbed | Placement | None = None
    hosts: dict = field(default_factory=dict)
    services: list = field(default_factory=list)
    capture: LiveCapture | None = None
    monitor: Monitor | None = None
    interference: Interference | None = None
    phases: dict = field(default_factory=dict)
    events: list[pa.Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    server_map: list[tuple[str, str, str, str]] = field(default_factory=list)  # addr:port tier name proto


# --- data: loaded once per the application's data key ----------------------------------------


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


# --- the stages of one point -------------------------------------------------------------------


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


def workload_file(config) -> Path:
    try:
        return provider(config.benchmark).workload_file(config.mix, config)
    except FileNotFoundError as err:
        raise PointFailed(str(err)) from None


def drive(ctx: PointContext, url: str, progress: Progress) -> dict:
    """Run the generator from the client host; return its final summary. With `[client] hosts = K`
    K generators run at once, each with its share of the users and its own seed, and their logs
    become one client_requests table (`load.merge_client_logs`)."""
    c = ctx.point.config
    k = c.client.hosts
    if k == 1:
        return _drive_one(
            ctx,
            url,
            progress,
            _users_of(ctx.point),
            ctx.point.seed,
            ctx.dir / "client_requests.parquet",
            ctx.dir / "generator.stderr.log",
            show=True,
        )
    shares = split_users(_users_of(ctx.point), k)
    results: list = [None] * k
    errors: list = [None] * k

    def one(i: int) -> None:
        first, n = shares[i]
        try:
            results[i] = _drive_one(
                ctx,
                url,
                progress,
                n,
                ctx.point.seed + first,
                ctx.dir / f"client_requests.gen{i + 1}.parquet",
                ctx.dir / f"generator.gen{i + 1}.stderr.log",
                show=i == 0,
            )
        except BaseException as err:  # noqa: BLE001 - re-raised below, in the runner's thread
            errors[i] = err

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()  # each generator ends after its ramp-up + run + ramp-down
    progress.users = _users_of(ctx.point)
    parts = [(ctx.dir / f"client_requests.gen{i + 1}.parquet", shares[i][0], 0) for i in range(k)]
    merge_client_logs(parts, ctx.dir / "client_requests.parquet")
    for path, _, _ in parts:
        path.unlink(missing_ok=True)
    for err in errors:
        if err is not None:
            raise err
    return {
        "generators": [
            {"generator": f"gen{i + 1}", "users": shares[i][1], "first_user": shares[i][0], **(r or {})}
            for i, r in enumerate(results)
        ],
        "throughput_rps": sum(float((r or {}).get("throughput_rps") or 0) for r in results),
    }


def _drive_one(
    ctx: PointContext, url: str, progress: Progress, users: int, seed: int, log: Path, stderr_log: Path, show: bool
) -> dict:
    """One generator from the client host; `show`: it feeds the live display and the phase times."""
    c = ctx.point.config
    w = c.workload
    argv = engine_args(
        workload_file(c),
        target=url,
        log=log,
        users=users,
        ramp_up=f"{w.ramp_up}s",
        duration=f"{w.run}s",
        ramp_down=f"{w.ramp_down}s",
        think=w.think_time,
        think_dispersion=w.dispersion if w.dispersion > 1 else None,
        seed=seed,
    )
    client = ctx.hosts.get("client1")

    def on_progress(msg: dict) -> None:
        if not show:
            return
        progress.phase = msg.get("phase", progress.phase)
        progress.active_users = int(msg.get("active_users", 0))
        progress.rps = float(msg.get("rps", 0.0))
        progress.p90_ms = msg.get("p90_ms")
        progress.errors = int(msg.get("errors_total", msg.get("errors", progress.errors)))

    if show:
        progress.users = users
        progress.phase = "ramp_up"
    t0 = time.time_ns()
    if show:
        ctx.phases["load_start_ns"] = t0
    with open(stderr_log, "w") as stderr:
        try:
            result = run_load(
                client.wrap(argv) if client is not None else argv, on_progress=on_progress, stderr_to=stderr
            )
        except LoadError as err:
            raise PointFailed(f"the workload generator failed: {err}") from None
    if show:
        ctx.phases.update(_phase_times(t0, w.ramp_up, w.run, w.ramp_down))
    if result.interrupted:
        raise KeyboardInterrupt
    if result.returncode != 0:
        tail = stderr_log.read_text()[-2000:]
        raise PointFailed(f"the workload generator exited with status {result.returncode}: {tail.strip()}")
    return result.summary or {}


def _users_of(point: Point) -> int:
    """The point's workload level (`expand` gives every point exactly one)."""
    return int(point.config.workload.users[0])


def _phase_times(t0: int, ramp_up: float, run: float, ramp_down: float) -> dict:
    s = lambda x: int(x * 1e9)  # noqa: E731
    return {
        "ramp_up": {"start_ns": t0, "end_ns": t0 + s(ramp_up)},
        "run": {"start_ns": t0 + s(ramp_up), "end_ns": t0 + s(ramp_up + run)},
        "ramp_down": {"start_ns": t0 + s(ramp_up + run), "end_ns": t0 + s(ramp_up + run + ramp_down)},
    }


def check_tiers_alive(ctx: PointContext) -> None:
    """Raise PointFailed naming every tier whose program has died."""
    dead = [s.name for s in ctx.services if not s.running()]
    if dead:
        raise PointFailed(f"tier died during the run: {', '.join(dead)}")


def collect(ctx: PointContext) -> dict:
    """Stop what runs and gather every table of the point; returns counts per table."""
    counts: dict[str, int] = {}
    if ctx.interference is not None:
        ctx.events.append(ctx.interference.stop())
        ctx.interference = None
    if ctx.monitor is not None:
        ctx.monitor.stop()
        ctx.monitor = None
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
    the replicas out of sync for the rest of the point: say so in the manifest's notes."""
    try:
        stats = json.loads(middleware.stats_path.read_text())
    except (OSError, ValueError) as err:
        ctx.notes.append(f"{middleware.name}: no counts written on exit ({err})")
        return
    for b in stats.get("backends", []):
        if not b.get("enabled", True):
            ctx.notes.append(f"{middleware.name} disabled database backend {b['name']}: {b.get('disabled_reason')}")


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


def machine() -> dict:
    return {
        "hostname": platform.node(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "python": platform.python_version(),
    }


def versions() -> dict:
    def first_line(argv: list[str]) -> str | None:
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        text = (out.stdout or out.stderr).strip().splitlines()
        return text[0] if text else None

    return {
        "tierscope": __version__,
        "tierscope-engine": engine_version(),
        "nginx": first_line(["nginx", "-v"]),
        **{name: first_line([binary, "--version"]) if binary else None for name, binary in server_binaries().items()},
        "tcpdump": first_line(["tcpdump", "--version"]),
    }


def write_manifest(
    ctx: PointContext,
    status: str,
    reason: str | None,
    spec: Spec,
    counts: dict,
    summary: dict,
    vers: dict,
    seconds: float,
) -> None:
    c = ctx.point.config
    m = manifest.Manifest(
        kind="run",
        status=status,
        reason=reason,
        point=manifest.PointInfo(
            id=ctx.point.id,
            index=ctx.point.index,
            repeat=ctx.point.repeat,
            params=ctx.point.params,
            seed=ctx.point.seed,
            users=_users_of(ctx.point),
            think_time_s=c.workload.think_time,
        ),
        topology=c.notation(),
        tiers={t: len(c.tier_servers(t)) for t in TIERS},
        phases=ctx.phases,
        tables=counts,
        generator=summary or None,
        testbed={
            "mode": ctx.testbed.mode if ctx.testbed is not None else None,
            "lost": ctx.testbed.lost if ctx.testbed is not None else [],
            "hosts": {n: {"address": h.address, "netns": h.netns, "cgroup": h.cgroup} for n, h in ctx.hosts.items()},
        },
        servers=[manifest.Server(address=a, tier=t, server=n, protocol=p) for a, t, n, p in ctx.server_map],
        notes=ctx.notes,
        seconds=round(seconds, 3),
        config=c.model_dump(mode="json"),
        spec_path=spec.path,
        versions=vers,
        machine=machine(),
    )
    manifest.write(m, ctx.dir / "manifest.json")


def point_status(point_dir: Path) -> str | None:
    """done / failed / None (never finished) from a point's manifest."""
    try:
        return manifest.read(point_dir / "manifest.json").status
    except (OSError, ValueError):
        return None


# --- the whole run -----------------------------------------------------------------------------


@dataclass
class RunResult:
    dir: Path
    done: list[str]
    failed: list[tuple[str, str]]
    skipped: list[str]
    interrupted: bool = False
    report: Path | None = None
    summary: object | None = None  # tierscope.report.Summary of the whole run
    data: object | None = None  # tierscope.report.Analysis the summary was built from


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
        ctx.testbed = Testbed(lab=free_lab(), workdir=pdir / "testbed", mode=mode, point_dir=pdir)
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


def remove_orphaned_labs(say) -> int:
    """Find the labs a killed run left (their owner is dead), say so one line each and remove them
    (`tierscope testbed clean --orphans`); returns how many."""
    try:
        orphans = find_orphans()
    except OSError:
        return 0
    for o in orphans:
        gone = remove_orphan(o.lab)
        say(
            f"{o}: removed {len(gone['processes'])} processes, {len(gone['netns'])} namespaces, "
            f"{len(gone['links'])} links, {len(gone['cgroups'])} cgroups"
            + (f"; could not remove {'; '.join(gone['errors'])}" if gone["errors"] else "")
        )
    return len(orphans)


def run_experiment(
    spec: Spec,
    out: Path,
    *,
    resume: bool = False,
    mode: str = "auto",
    run_name: str | None = None,
    progress: Progress | None = None,
    report: bool = True,
) -> RunResult:
    """Run every point of `spec` into `out/<run>/`; then analyse and write report.html."""
    progress = progress or Progress()
    points = expand(spec)
    remove_orphaned_labs(progress.say)
    run_dir = Path(out) / (run_name or spec.name)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.json").write_text(json.dumps({"started_ns": time.time_ns(), "spec": spec.path}))
    (run_dir / "spec.json").write_text(json.dumps(spec.model_dump(mode="json"), indent=1, default=str))
    result = RunResult(run_dir, [], [], [])
    todo = []
    for p in points:
        if resume and point_status(run_dir / p.id) == DONE:
            result.skipped.append(p.id)
            progress.finished.append((p.id, "skipped", "finished in an earlier run"))
        else:
            todo.append(p)
    progress.points_total = len(points)
    vers = versions()
    try:
        data_dirs = prepare_data(todo, run_dir / ".work", progress.say) if todo else {}
        for p in todo:
            progress.point_index = points.index(p) + 1
            progress.point_id = p.id
            progress.point_started = time.monotonic()
            w = p.config.workload
            progress.point_seconds = w.ramp_up + w.run + w.ramp_down
            progress.errors = 0
            status, reason = run_point(p, spec, run_dir, data_dirs, mode, progress, vers)
            if status == DONE:
                result.done.append(p.id)
            else:
                result.failed.append((p.id, reason or "failed"))
            progress.finished.append((p.id, status, reason or ""))
    except KeyboardInterrupt:
        result.interrupted = True
        return result
    finally:
        shutil.rmtree(run_dir / ".work", ignore_errors=True)
    if report and (result.done or result.skipped):
        progress.phase = "analysing"
        result.report, result.summary, result.data = write_run_report(run_dir, spec)
    return result


def write_run_report(run_dir: Path, spec: Spec) -> tuple[Path, object, object]:
    """Analyse the run and write run_dir/report.html (with the finding of the shipped study its
    run.json names, `studies.finding_of_run`); returns its path, the summary and the data."""
    points = expand(spec)
    window_ns = int(round(points[0].config.monitor.window * 1e9)) if points else DEFAULT_WINDOW_NS
    data = analyze_run(run_dir, window_ns=window_ns)
    summary = build_summary(data)
    finding = finding_of_run(data, run_dir)
    return write_report(data, run_dir / "report.html", summary, finding=finding), summary, data
