"""The application server: gunicorn with gthread workers running a WSGI application: `app` is a
`tierscope.contracts.apps.WsgiApp` run against the database `db` (a provider passes its own, e.g.
`apps.rubbos.provider.WSGI_APP`), or an entry point "module:factory()" configured by `app_env`
alone (e.g. the log service, the bookstore). This module knows no application: which app it runs,
what that app reads from its environment and where its events are come from its caller.

The soft resources the seed papers turn are parameters: `workers` (processes), `threads` per
worker (like Tomcat's maxThreads: requests in service at once per worker) and `pool_size`, the
bounded database connection pool of each worker (like the servlets' connection pool). `connections`
bounds the open client connections per worker (gthread's worker_connections: accepted requests
beyond `threads` wait for a thread, like Tomcat's acceptCount) and `backlog` the kernel's accept
queue. An app may record its own events (GC pauses, injected pauses) as `events` rows in
`events_dir`; `events()` reads them as one table (its `WsgiApp.events`).

In a root lab the whole gunicorn (master and workers) runs as the lab's unprivileged system user
(`services._accounts.LAB_OS_USER`, `setpriv`, which execs, so the pid stays the server's): the
work and events directories are given to it, their ancestors made searchable (o+x), and the
database password reaches it in its environment, which only that user and root can read in /proc.
"""

from __future__ import annotations

import os
import sys
import urllib.request
from dataclasses import replace
from pathlib import Path

import tierscope
from tierscope import tables
from tierscope.contracts import poolgauge
from tierscope.contracts.apps import WsgiApp
from tierscope.contracts.dbms import DbConfig
from tierscope.services._accounts import AccountError, give_to, lab_account, open_the_way, run_as
from tierscope.services.base import Service, ServiceError
from tierscope.testbed.host import Host


def _has_setting(name: str) -> bool:
    from gunicorn.config import KNOWN_SETTINGS

    return any(s.name == name for s in KNOWN_SETTINGS)


class AppServer(Service):
    """gunicorn (gthread) serving a WSGI application on host:port."""

    kind = "appserver"
    start_timeout = 60.0

    def __init__(
        self,
        host: Host,
        port: int,
        workdir: str | Path,
        *,
        app: str | WsgiApp,
        db: DbConfig | None = None,
        app_env: dict[str, str] | None = None,
        health_path: str | None = None,
        workers: int = 2,
        threads: int = 8,
        pool_size: int | None = None,
        pool_timeout_s: float = 10.0,
        backlog: int = 2048,
        connections: int = 1000,
        keepalive_s: int = 75,
        timeout_s: int = 60,
        access_log: bool = False,
        events_dir: str | Path | None = None,
        allow_pause: bool = False,
        pause_every_s: float = 0.0,
        pause_ms: float = 0.0,
        name: str | None = None,
    ):
        super().__init__(host, port, workdir, name)
        for label, value in (("workers", workers), ("threads", threads)):
            if int(value) < 1:
                raise ValueError(f"appserver {label}: expected >= 1, got {value}")
        self.workers = int(workers)
        self.threads = int(threads)
        self.db = replace(db, pool_size=int(pool_size or threads), pool_timeout_s=pool_timeout_s) if db else None
        #: each worker's pool of database connections (None: not known, e.g. an app configured by
        #: `app_env` alone that was not told)
        self.pool_size = self.db.pool_size if self.db else (int(pool_size) if pool_size else None)
        self.wsgi: WsgiApp | None = None if isinstance(app, str) else app
        self.app = app if isinstance(app, str) else app.entry
        self.app_env = dict(app_env or {})
        self.health_path = health_path or (self.wsgi.health_path if self.wsgi else "/health")
        self.backlog = backlog
        self.connections = int(connections)
        self.keepalive_s = keepalive_s
        self.timeout_s = timeout_s
        self.access_log_enabled = access_log
        self.events_dir = Path(events_dir).absolute() if events_dir else self.workdir / "events"
        self.allow_pause = allow_pause
        self.pause_every_s = pause_every_s
        self.pause_ms = pause_ms
        self.server_name = name or f"app@{host.name}:{port}"

    @property
    def url(self) -> str:
        return f"http://{self.host.address}:{self.port}"

    @property
    def error_log(self) -> Path:
        return self.workdir / "gunicorn.error.log"

    @property
    def access_log(self) -> Path:
        return self.workdir / "gunicorn.access.log"

    @property
    def pool_gauge_dir(self) -> Path:
        """Where the workers count their connections taken (`contracts.poolgauge`)."""
        return self.workdir / "pool-gauge"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.app_env, PYTHONUNBUFFERED="1")
        env[poolgauge.ENV] = str(self.pool_gauge_dir)
        if self.db is None or self.wsgi is None:
            return env
        env.update(self.wsgi.env(self), PYTHONUNBUFFERED="1")
        return env

    def prepare(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.pool_gauge_dir.mkdir(exist_ok=True)
        for stale in self.pool_gauge_dir.iterdir():  # a previous run's workers
            stale.unlink()
        self.events_dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            acct = self.run_account()
            try:
                open_the_way(acct, self._code_paths(), "the app server")
            except AccountError as err:
                raise ServiceError(f"{self.name}: {err}") from None
            give_to(acct.pw_name, self.workdir)  # its logs and pid file
            give_to(acct.pw_name, self.events_dir)  # the events its workers record

    def busy_sessions_probe(self) -> PoolInUse:
        """A probe of the workers' database connections taken now (`runner.activity`
        samples it as this server's `db_connections_busy` and `connections_util`)."""
        if self.pool_size is None:
            raise ServiceError(f"{self.name}: its pool size is not known (pass pool_size)")
        return PoolInUse(self.pool_gauge_dir, self.workers * self.pool_size)

    def run_account(self):
        """The account gunicorn runs as in a root lab: the lab's system user."""
        try:
            return lab_account()
        except AccountError as err:
            raise ServiceError(f"{self.name}: {err}") from None

    def _code_paths(self) -> list[Path]:
        """What the unprivileged user must read to run the app: the interpreter, gunicorn, tierscope."""
        import gunicorn

        return [Path(sys.executable), Path(gunicorn.__file__), Path(tierscope.__file__)]

    def command(self) -> list[str]:
        argv = [
            sys.executable,
            "-m",
            "gunicorn",
            "--worker-class",
            "gthread",
            "--workers",
            str(self.workers),
            "--threads",
            str(self.threads),
            "--bind",
            f"{self.host.address}:{self.port}",
            "--backlog",
            str(self.backlog),
            "--worker-connections",
            str(self.connections),
            "--keep-alive",
            str(self.keepalive_s),
            "--timeout",
            str(self.timeout_s),
            "--graceful-timeout",
            "10",
            "--error-logfile",
            str(self.error_log),
            "--pid",
            str(self.workdir / "gunicorn.pid"),
            "--worker-tmp-dir",
            "/dev/shm" if os.path.isdir("/dev/shm") else str(self.workdir),
            "--name",
            f"{self.app.split('.')[2] if self.app.count('.') >= 2 else 'app'}-{self.port}",
        ]
        if self.workers > 1:
            # one listening socket per worker (SO_REUSEPORT): the kernel spreads new connections
            # over them. On one shared socket the worker that registered first wins every accept,
            # so the web server's kept-alive connections all land on it and the others sit idle
            # (measured: 198 of 198 connections on one of two workers at 400 users)
            argv.append("--reuse-port")
        if _has_setting("control_socket_disable"):  # gunicorn >= 24: one shared socket path otherwise
            argv.append("--no-control-socket")
        if self.access_log_enabled:
            argv += [
                "--access-logfile",
                str(self.access_log),
                "--access-logformat",
                '%(h)s %(t)s "%(r)s" %(s)s %(B)s %(M)s %({x-request-id}i)s',
            ]
        argv.append(self.app)
        return run_as(self.run_account().pw_name, argv) if os.geteuid() == 0 else argv

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + self.health_path, timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def logs(self) -> dict[str, Path]:
        out = super().logs()
        for name, p in (("error", self.error_log), ("access", self.access_log)):
            if p.exists():
                out[name] = p
        return out

    def events(self):
        """The `events` table the app's workers recorded so far (none for an app without a reader)."""
        if self.wsgi is None:
            return tables.empty("events")
        return self.wsgi.events(self.events_dir)


class PoolInUse:
    """The connections an app server's workers hold out of their pools, against all of them."""

    def __init__(self, directory: Path, limit: int):
        self.directory = directory
        #: the workers' pools together
        self.limit = limit

    def busy(self) -> int:
        return poolgauge.in_use(self.directory)

    def close(self) -> None:
        pass
