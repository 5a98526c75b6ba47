"""The whole 3-tier RUBBoS system on one host: a database server (PostgreSQL or MariaDB) with a
loaded scale, N gunicorn application servers, and nginx in front.

`bring_up()` starts everything (restoring the scale's snapshot when a fresh one exists, otherwise
loading and snapshotting) through the lab's one assembly (`tierscope.assembly`, as `tierscope run`
does in its hosts) and writes `state.json` in the run directory; `bring_down()` (a later,
separate process) stops every process listed there whose start time and command line still match
the record. The run directory (default `/run/tierscope/rubbos` as root, else a directory of the
user's own: `tierscope.statedir`) is refused when another user owns it or can write to it, and
the state file is written atomically and never through a symbolic link. Used by
`tierscope rubbos up/down/load` and by bench/rubbos.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from tierscope import assembly, statedir
from tierscope.apps import snapshot
from tierscope.apps.rubbos import datagen
from tierscope.apps.rubbos.provider import PROVIDER
from tierscope.assembly import Server, Soft
from tierscope.contracts.dbms import DbConfig
from tierscope.services.appserver import AppServer
from tierscope.services.base import Service, ServiceError, tcp_answers
from tierscope.services.nginx import Nginx
from tierscope.testbed.host import Host

DEFAULT_RUN_DIR = Path(os.environ.get("TIERSCOPE_RUBBOS_DIR") or statedir.default_dir("rubbos"))
DEFAULT_DB_PORT = {"postgresql": 25432, "mariadb": 23306}


@dataclass
class Options:
    dbms: str = "postgresql"
    scale: str = "tiny"
    seed: int = 42
    app_servers: int = 1
    workers: int = 2
    threads: int = 8
    pool_size: int | None = None
    balance: str = "round_robin"
    port: int = 8080
    app_port: int = 9001
    db_port: int | None = None
    run_dir: Path = DEFAULT_RUN_DIR
    fresh: bool = False
    snapshots: Path = snapshot.default_root("rubbos")
    fsync: bool = False
    db_memory: str = "256M"


@dataclass
class System:
    options: Options
    db: Service
    db_config: DbConfig
    apps: list[AppServer] = field(default_factory=list)
    web: Nginx | None = None
    load_report: datagen.LoadReport | None = None
    restored_from: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.options.port}/rubbos/StoriesOfTheDay"

    def services(self) -> list[Service]:
        return [self.db, *self.apps, *([self.web] if self.web else [])]

    def stop(self) -> None:
        """Stop every service, the last started first (the assembly's stop path)."""
        assembly.RunningSystem(services=self.services()).stop()


def _soft(o: Options) -> Soft:
    """The options as the assembly's soft resources (nginx: one worker, its default connections)."""
    app = SimpleNamespace(workers=o.workers, threads=o.threads, db_pool=o.pool_size)
    return Soft(db_cache=o.db_memory, fsync=o.fsync, app=app, balance=o.balance)


def _db_server(o: Options, workdir: Path) -> Server:
    return Server(None, Host.loopback("db"), o.db_port or DEFAULT_DB_PORT[o.dbms], workdir)


def make_db(
    dbms: str,
    port: int,
    workdir: Path,
    fsync: bool = False,
    memory: str = "256M",
    host: Host | None = None,
    max_connections: int = 300,
    name: str | None = None,
) -> tuple[Service, DbConfig]:
    """The database server for RUBBoS (not started) and the app's configuration to reach it.

    `memory` is the cache (shared_buffers / innodb_buffer_pool_size) as "<n>M"; `host` defaults to
    loopback.
    """
    server = Server(name, host or Host.loopback("db"), port, workdir)
    return assembly.database_server(
        PROVIDER, dbms, server, Soft(db_cache=memory, db_max_connections=max_connections, fsync=fsync)
    )


@dataclass
class _Data:
    """Where the database's data comes from: a fresh snapshot (`data_dir`), else `load` fills the
    started server and snapshots it (`report`: what it loaded)."""

    data_dir: Path | None = None
    restored_from: Path | None = None
    report: datagen.LoadReport | None = None
    load: Callable[[Service, DbConfig], None] | None = None


def _data(o: Options, say: Callable[[str], None]) -> _Data:
    snap = snapshot.snapshot_for("rubbos", o.dbms, o.scale, o.seed, datagen.GENERATOR_VERSION, o.snapshots)
    if not o.fresh and snap.fresh():
        say(f"restoring {o.dbms} {o.scale} from snapshot {snap.path} (loaded {snap.age_s() / 3600:.1f} h ago)")
        return _Data(data_dir=snap.data, restored_from=snap.path)
    data = _Data()

    def load(db: Service, cfg: DbConfig) -> None:
        say(f"loading scale {o.scale} into {o.dbms} ...")
        report = datagen.load(cfg, o.scale, o.seed, progress=lambda m: say("  " + m))
        for line in report.lines():
            say("  " + line)
        snapshot.take(
            db,
            snap,
            {
                "dbms": o.dbms,
                "scale": o.scale,
                "seed": o.seed,
                "loaded_at": time.time(),
                "generator": datagen.GENERATOR_VERSION,
                "rows": report.rows,
                "db_size_bytes": report.db_size_bytes,
            },
        )
        say(f"snapshot saved in {snap.path}")
        data.report = report

    data.load = load
    return data


def start_loaded_db(
    o: Options, workdir: Path, say=print
) -> tuple[Service, DbConfig, datagen.LoadReport | None, Path | None]:
    """A database server with the scale loaded: restored from a fresh snapshot, or loaded now
    (and snapshotted for next time)."""
    data = _data(o, say)
    running = assembly.RunningSystem()
    try:
        db, cfg, _ = assembly.start_database(
            PROVIDER, o.dbms, _db_server(o, workdir), _soft(o), running, data_dir=data.data_dir, load=data.load
        )
    except BaseException:
        running.stop()
        raise
    return db, cfg, data.report, data.restored_from


def bring_up(o: Options, say=print) -> System:
    """Start the system `o` describes on loopback (`tierscope.assembly`: the database from the
    scale's snapshot or loaded now, the app servers, nginx) and write `state.json`."""
    run = Path(o.run_dir).absolute()
    state = run / "state.json"
    try:  # before starting anything: a directory or state file not ours is refused
        statedir.secure_dir(run)
        statedir.check_writable(state)
        old = statedir.read_json(state) or {}
    except statedir.StateError as err:
        raise ServiceError(str(err)) from None
    if any(statedir.same_process(p)[0] for p in old.get("processes", []) if isinstance(p, dict)):
        raise ServiceError(f"a RUBBoS system is already running from {run} (run `tierscope rubbos down` first)")
    ports = [o.port] + [o.app_port + i for i in range(o.app_servers)]
    for p in ports:
        if tcp_answers("127.0.0.1", p, timeout=0.2):
            raise ServiceError(f"port {p} is already in use (choose another with --port/--app-port)")
    # logs and events of an earlier run in the same directory would mix with this one's
    shutil.rmtree(run / "events", ignore_errors=True)
    for stale in (run / "nginx" / "access.log", run / "nginx" / "error.log"):
        stale.unlink(missing_ok=True)
    layout = assembly.Layout(
        dbms=o.dbms,
        db=[_db_server(o, run / o.dbms)],
        app=[
            Server(f"app{i + 1}", Host.loopback(f"app{i + 1}"), o.app_port + i, run / f"app{i + 1}", run / "events")
            for i in range(o.app_servers)
        ],
        web=[Server(None, Host.loopback("web"), o.port, run / "nginx")],
        static_dir=run / "www",
    )

    def started(tier: str, svc: Service) -> None:
        if tier == "app":
            say(f"app server {svc.name} on {svc.url} ({o.workers} workers x {o.threads} threads)")  # type: ignore[attr-defined]

    data = _data(o, say)
    running = assembly.assemble(PROVIDER, layout, _soft(o), data_dir=data.data_dir, load=data.load, on_start=started)
    system = System(
        o,
        running.tier("db")[0],
        running.db_config,
        apps=running.tier("app"),
        web=running.tier("web")[0],
        load_report=data.report,
        restored_from=data.restored_from,
    )
    write_state(system)
    creds = getattr(system.db, "credentials", None)
    if creds is not None and creds.path is not None:
        say(
            f"database credentials: {creds.path} (user {creds.user}; root only: every server of this "
            "system, the database's and the middleware's, requires them)"
        )
    return system


def write_state(system: System) -> Path:
    o = system.options
    procs = []
    for s in system.services():
        who = statedir.identity(s.proc.pid) if s.proc else None  # pid, start time, command line
        procs.append(
            {
                "name": s.name,
                "kind": s.kind,
                "pid": s.proc.pid if s.proc else None,
                "start_time": who["start_time"] if who else None,
                "cmdline": who["cmdline"] if who else None,
                "stop_signal": int(s.stop_signal if s.kind != "postgres" else signal.SIGINT),
                "address": s.address,
                "logs": {k: str(v) for k, v in s.logs().items()},
            }
        )
    state = {
        "url": system.url,
        "dbms": o.dbms,
        "scale": o.scale,
        "seed": o.seed,
        "started_at": time.time(),
        "db": {
            "host": system.db_config.host,
            "port": system.db_config.port,
            "user": system.db_config.user,
            "database": system.db_config.database,
        },
        "access_log": str(system.web.access_log) if system.web else None,
        "events_dir": str(Path(o.run_dir) / "events"),
        "processes": procs,
    }
    return statedir.write_json(Path(o.run_dir).absolute() / "state.json", state)


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def bring_down(run_dir: Path = DEFAULT_RUN_DIR, timeout: float = 30.0, say=print) -> int:
    """Stop every process `bring_up` recorded in run_dir/state.json (reverse start order) that is
    still the process recorded (same pid, start time and command line); return how many it stopped.

    Raises ServiceError for a state directory or file tierscope does not trust (another user's, a
    symbolic link) and, after stopping what matched, when a recorded process could not be checked
    (it is left alone: a pid reused by another process, or a planted record).
    """
    state_path = Path(run_dir).absolute() / "state.json"
    if not Path(run_dir).exists():
        say(f"nothing to stop: no {state_path}")
        return 0
    try:
        state = statedir.read_json(state_path)
    except statedir.StateError as err:
        raise ServiceError(str(err)) from None
    if state is None:
        say(f"nothing to stop: no {state_path}")
        return 0
    stopped = 0
    refused = []
    for p in reversed(state.get("processes", [])):
        if not isinstance(p, dict) or not p.get("pid"):
            continue
        pid = p["pid"]
        same, why = statedir.same_process(p)
        if not same:
            if statedir.identity(pid) is not None:  # a live process that is not the one recorded
                refused.append(f"{p.get('name', '?')}: {why}")
            continue
        stopped += 1
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGCONT)
        try:
            os.kill(pid, int(p.get("stop_signal", signal.SIGTERM)))
        except ProcessLookupError:
            continue
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        # leftovers of its session (workers, helpers): the group the recorded process leads
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        say(f"stopped {p['name']} (pid {pid})")
    if refused:
        raise ServiceError(
            f"{state_path}: not stopping {len(refused)} recorded process(es) that are not the ones `rubbos up` "
            f"started: {'; '.join(refused)}; the state file is kept (remove it yourself once you have checked)"
        )
    state_path.unlink()
    return stopped
