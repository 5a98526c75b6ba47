"""The one assembly of a system under test: database server(s), clustering middleware, app servers
and nginx, started in that order from a layout, for any application and DBMS.

`assemble(app, layout, soft)` starts every server of `layout` (each tier's servers with their
host, port and working directory) for the application `app` (its provider, `tierscope.apps`): the
database servers from loaded data (`data_dir`, restored before each starts) or filled once started
(`load`), the middleware servers with every database server as a backend, the app servers spread
over the middleware servers round robin (without middleware, all on the first database server's
configuration, which the provider widens to every node of a Galera cluster), and nginx over all app
servers. It returns the `RunningSystem`: its services in start order, the
servers as the tracer names them, the URL, and `stop()`. `tierscope run` (`runner.start_tiers`, in
the hosts of a testbed) and `tierscope rubbos up` (`apps.rubbos.system.bring_up`, on loopback)
both assemble their system here; the remote agent starts its one server with the same per-tier
functions (`start_database`, `start_middleware`, `start_app_server`, `start_web`).

What is application- or DBMS-specific is asked of the provider and of `services.databases`; this
module only puts the tiers together.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tierscope.contracts.apps import AppProvider
from tierscope.services import databases
from tierscope.services.base import read_through
from tierscope.services.middleware import Middleware
from tierscope.services.nginx import Nginx

if TYPE_CHECKING:
    from tierscope.testbed.host import Host

#: ports the web and app tiers listen on inside their hosts (every host has its own address; a
#: database server listens on its DBMS's port, `services.databases.PORT`)
WEB_PORT, APP_PORT = 8000, 9000
#: the port the clustering middleware listens on inside its host (C-JDBC's port in the Elba setup)
MIDDLEWARE_PORT = 25322


@dataclass
class Server:
    """One server of a layout: its name (None: the service's default name), the host it runs in,
    the port it listens on there and its working directory; an app server's events directory."""

    name: str | None
    host: Host
    port: int
    workdir: Path
    events_dir: Path | None = None

    @property
    def address(self) -> str:
        return f"{self.host.address}:{self.port}"


@dataclass
class Layout:
    """The tiers of a system: the servers of each (start order: db, middleware, app, web), the DBMS
    (a services name, `services.databases.DBMS`), and where the static content for nginx is written
    (`static_dir`, for `config`: a PointConfig or None)."""

    dbms: str
    db: list[Server]
    app: list[Server]
    web: list[Server]
    static_dir: Path
    middleware: list[Server] = field(default_factory=list)
    config: Any = None


@dataclass
class Soft:
    """How the servers run: the database's cache ("<n>M"), connections, fsync and page-cache warming;
    the app servers' soft resources (`app`: workers, threads, db_pool), the middleware's (`middleware`:
    pool, policy, wait, weights) and nginx's workers, connections per worker and balancing."""

    db_cache: str = "256M"
    db_max_connections: int = 300
    fsync: bool = False
    warm: bool = False
    app: Any = None
    middleware: Any = None
    web_workers: int = 1
    web_connections: int = 4096
    balance: str = "round_robin"


@dataclass
class RunningSystem:
    """What an assembly started: `services` in start order (each added before it starts, so a start
    that fails is stopped with the others), `servers` as (address, tier, name, wire protocol) of each
    server that answered, the database configuration the app servers start from (`db_config`), the
    URL of the first web server and notes. `stop()` stops the services in reverse."""

    services: list = field(default_factory=list)
    servers: list = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    db_config: Any = None
    url: str = ""
    tiers: dict[str, list] = field(default_factory=dict)  # tier -> its services that answered, in order

    def started(self, tier: str, svc: Any, protocol: str) -> None:
        """Record `svc` of `tier` as answering (`protocol`: the wire protocol the tracer decodes)."""
        self.servers.append((svc.address, tier, svc.name, protocol))
        self.tiers.setdefault(tier, []).append(svc)

    def tier(self, tier: str) -> list:
        """The services of `tier` that answered, in start order."""
        return list(self.tiers.get(tier, []))

    def stop(self, on_error: Callable[[Any, Exception], None] | None = None) -> None:
        """Stop every service, the last started first; a failure to stop one goes to `on_error`
        (ignored without) and the others are still stopped."""
        for svc in reversed(self.services):
            try:
                svc.stop()
            except Exception as err:  # keep stopping the others
                if on_error is not None:
                    on_error(svc, err)


def point_layout(config: Any, hosts: Mapping[str, Any], workdir: Path) -> Layout:
    """The layout of a spec point (`config`: its PointConfig) in `hosts` (server name -> Host), each
    server working in `workdir/<name>`, an app server's events in `workdir/app-events/<name>`."""
    dbms = databases.dbms_name(config.dbms)

    def servers(tier: str, port: int) -> list[Server]:
        return [
            Server(
                s.name,
                hosts[s.name],
                port,
                workdir / s.name,
                events_dir=workdir / "app-events" / s.name if tier == "app" else None,
            )
            for s in config.tier_servers(tier)
        ]

    return Layout(
        dbms=dbms,
        db=servers("db", databases.PORT[dbms]),
        middleware=servers("middleware", MIDDLEWARE_PORT),
        app=servers("app", APP_PORT),
        web=servers("web", WEB_PORT),
        static_dir=workdir / "www",
        config=config,
    )


def point_soft(config: Any) -> Soft:
    """A spec point's soft resources as the assembly takes them."""
    s = config.soft
    return Soft(
        db_cache=f"{max(16, s.db.cache // 2**20)}M",
        db_max_connections=s.db.max_connections,
        fsync=s.db.fsync,
        warm=s.db.warm,
        app=s.app,
        middleware=s.middleware,
        web_workers=s.web.workers,
        web_connections=s.web.connections,
    )


# --- one tier's server ---------------------------------------------------------------------------


def database_server(app: AppProvider, dbms: str, server: Server, soft: Soft) -> tuple[Any, Any]:
    """The database server (not started) of the app `app` for `server`, and the `DbConfig` an app
    uses to reach it."""
    return app.database_server(
        dbms,
        server.host,
        server.port,
        server.workdir,
        cache=soft.db_cache,
        max_connections=soft.db_max_connections,
        name=server.name,
        fsync=soft.fsync,
    )


def start_database(
    app: AppProvider,
    dbms: str,
    server: Server,
    soft: Soft,
    system: RunningSystem,
    *,
    data_dir: Path | None = None,
    load: Callable[[Any, Any], None] | None = None,
    phase: Callable[[str], None] = lambda _: None,
) -> tuple[Any, Any, tuple[int, float] | None]:
    """Start one database server: `data_dir` (the loaded data) restored into it first, or `load`
    (service, DbConfig) filling it once it answers; with `soft.warm` its table files read through
    its host's page cache. Returns the service, its `DbConfig` and (bytes, seconds) warmed (None
    when not warmed)."""
    db, cfg = database_server(app, dbms, server, soft)
    if data_dir is not None:
        app.restore(data_dir, db)
    system.services.append(db)
    db.start()
    if load is not None:
        load(db, cfg)
    warmed = None
    if soft.warm:
        phase(f"warming {db.name}'s page cache")
        t0 = time.monotonic()
        size = read_through(server.host, db.table_files())
        warmed = (size, time.monotonic() - t0)
    system.started("db", db, databases.PROTOCOL[dbms])
    return db, cfg, warmed


def middleware_server(s: Server, backends: list[str], db_cfg: Any, resources: Soft) -> Any:
    """The middleware (not started) on server `s` in front of the database servers `backends`
    ("addr:port") holding the database `db_cfg` names."""
    soft = resources.middleware
    mw = Middleware(
        s.host,
        s.port,
        s.workdir,
        backends=backends,
        database=db_cfg.database,
        user=db_cfg.user,
        password=db_cfg.password,
        dbms=db_cfg.dbms,
        pool=soft.pool,
        policy=soft.policy,
        wait=soft.wait,
        weights=soft.weights,
        labels=soft.labels,
        scheduler=soft.scheduler,
        name=s.name,
    )
    return mw


def start_middleware(server: Server, backends: list[str], db_cfg: Any, soft: Soft, system: RunningSystem) -> Any:
    """Start one middleware server (see `middleware_server`); returns it."""
    mw = middleware_server(server, backends, db_cfg, soft)
    system.services.append(mw)
    mw.start()
    system.started("middleware", mw, mw.protocol)
    return mw


def app_db_configs(layout: Layout, db_cfg: Any, soft: Soft) -> list[Any]:
    """The database configuration of each app server slot: `db_cfg` without middleware, else one per
    middleware server (in layout order), pointing at it; app server i uses entry i modulo their
    number."""
    if not layout.middleware:
        return [db_cfg]
    backends = [s.address for s in layout.db]
    return [middleware_server(m, backends, db_cfg, soft).db_config(db_cfg) for m in layout.middleware]


def start_app_server(app: AppProvider, server: Server, db_cfg: Any, soft: Soft, system: RunningSystem) -> Any:
    """Start one app server of the app `app` against `db_cfg`; returns it."""
    svc = app.app_server(
        server.host,
        server.port,
        server.workdir,
        db=db_cfg,
        soft=soft.app,
        events_dir=server.events_dir or server.workdir / "events",
        name=server.name,
    )
    system.services.append(svc)
    svc.start()
    system.started("app", svc, "http")
    return svc


def start_web(server: Server, root: Path, upstreams: list[str], soft: Soft, system: RunningSystem) -> Any:
    """Start one nginx serving `root` in front of the app servers `upstreams` ("addr:port")."""
    web = Nginx(
        server.host,
        server.port,
        server.workdir,
        root=root,
        upstreams=upstreams,
        balance=soft.balance,
        workers=soft.web_workers,
        worker_connections=soft.web_connections,
        name=server.name,
    )
    system.services.append(web)
    web.start()
    system.started("web", web, "http")
    return web


# --- the whole system ----------------------------------------------------------------------------


def assemble(
    app: AppProvider,
    layout: Layout,
    soft: Soft,
    *,
    data_dir: Path | None = None,
    load: Callable[[Any, Any], None] | None = None,
    system: RunningSystem | None = None,
    phase: Callable[[str], None] = lambda _: None,
    on_start: Callable[[str, Any], None] = lambda _tier, _svc: None,
) -> RunningSystem:
    """Start the system `layout` describes for the app `app` (its provider); return it running.

    Every database server starts from `data_dir` (or is filled by `load`, see `start_database`);
    the first one's configuration is what the middleware and the app servers reach. `system`: the
    running system to fill (the caller's lists, so that what started before a failure is known to
    its own stop path); without, a new one, stopped here when a start fails. `phase` hears what is
    starting, `on_start` (tier, service) each server that answered."""
    owned = system is None
    system = system if system is not None else RunningSystem()
    try:
        _assemble(app, layout, soft, system, data_dir, load, phase, on_start)
    except BaseException:
        if owned:
            system.stop()
        raise
    return system


def _assemble(
    app: AppProvider, layout: Layout, soft: Soft, system: RunningSystem, data_dir, load, phase, on_start
) -> None:
    dbs = layout.db
    for server in dbs:
        phase(f"starting database {server.name}" if len(dbs) > 1 else "starting database")
        db, cfg, warmed = start_database(
            app, layout.dbms, server, soft, system, data_dir=data_dir, load=load, phase=phase
        )
        if warmed is not None:
            size, seconds = warmed
            system.notes.append(
                f"{db.name}: read its {size / 2**20:.0f} MiB of table files before the load "
                f"(soft.db.warm) in {seconds:.1f} s"
            )
        system.db_config = system.db_config or cfg
        on_start("db", db)

    app_cfgs = [system.db_config]
    if layout.middleware:
        backends = [s.address for s in layout.db]
        app_cfgs = []
        for server in layout.middleware:
            phase(f"starting middleware {server.name}")
            mw = start_middleware(server, backends, system.db_config, soft, system)
            app_cfgs.append(mw.db_config(system.db_config))
            on_start("middleware", mw)

    phase("starting app servers")
    apps = []
    for i, server in enumerate(layout.app):
        a = start_app_server(app, server, app_cfgs[i % len(app_cfgs)], soft, system)
        apps.append(a)
        on_start("app", a)

    phase("starting web server")
    root = app.static_root(layout.static_dir, layout.config)
    webs = []
    for server in layout.web:
        webs.append(start_web(server, root, [a.address for a in apps], soft, system))
        on_start("web", webs[-1])
    if len(webs) > 1:
        system.notes.append(f"{len(webs)} web servers: the generator drives the first one only")
    if webs:
        system.url = f"http://{webs[0].address}"
