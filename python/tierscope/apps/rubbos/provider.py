"""RUBBoS as the runner sees it (`tierscope.apps.AppProvider`): data loaded once per (DBMS, scale,
seed) into a snapshot every database server starts from, the gunicorn app, the static pages, the
workload files of the mixes, and the app's GC and pause events."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from tierscope.apps import WsgiApp
from tierscope.apps.loaded import LoadedDatabaseApp
from tierscope.apps.rubbos import datagen, events, mixes, pages
from tierscope.services.appserver import AppServer


def scale_name(scale: float | str) -> str:
    """The RUBBoS data preset for a spec's `scale`: a preset name, or a fraction of the paper's data
    set rounded to the nearest preset on a log scale (tiny = 0.002, small = 0.2, paper = 1 by users;
    the boundaries are the geometric midpoints 0.02 and 0.45)."""
    if isinstance(scale, str):
        return scale
    if scale < 0.02:
        return "tiny"
    if scale < 0.45:
        return "small"
    return "paper"


def server_env(server: Any) -> dict[str, str]:
    """The RUBBoS app's configuration (`app.AppConfig.from_env`) for the app server `server` (a
    `services.appserver.AppServer` with a database `db`)."""
    d = server.db
    return dict(
        RUBBOS_DBMS=d.dbms,
        RUBBOS_DB_HOST=d.host,
        RUBBOS_DB_PORT=str(d.port),
        RUBBOS_DB_USER=d.user,
        RUBBOS_DB_PASSWORD=d.password,
        RUBBOS_DB_NAME=d.database,
        RUBBOS_POOL_SIZE=str(d.pool_size),
        RUBBOS_POOL_TIMEOUT_S=str(d.pool_timeout_s),
        RUBBOS_HOST_NAME=server.server_name,
        RUBBOS_EVENTS_DIR=str(server.events_dir),
        RUBBOS_ALLOW_PAUSE="1" if server.allow_pause else "0",
        RUBBOS_PAUSE_EVERY_S=str(server.pause_every_s),
        RUBBOS_PAUSE_MS=str(server.pause_ms),
    )


def collect_events(events_dir: Path) -> pa.Table:
    """The GC and injected-pause events the app's workers wrote under `events_dir`."""
    return events.collect(events_dir)


#: the RUBBoS app as the app server runs it
WSGI_APP = WsgiApp("tierscope.apps.rubbos.app:create_app()", "/rubbos/health", server_env, collect_events)


class RubbosProvider(LoadedDatabaseApp):
    name = "rubbos"
    snapshots = "rubbos"
    database = "rubbos"

    def scale_name(self, scale: float | str) -> str:
        return scale_name(scale)

    def datagen(self) -> Any:
        return datagen

    def app_server(
        self, host: Any, port: int, workdir: Path, *, db: Any, soft: Any, events_dir: Path, name: str | None
    ) -> Any:
        return AppServer(
            host,
            port,
            workdir,
            db=self.client_config(db),
            app=WSGI_APP,
            workers=soft.workers,
            threads=soft.threads,
            pool_size=soft.db_pool,
            events_dir=events_dir,
            name=name,
        )

    def static_root(self, directory: Path, config: Any = None) -> Path:
        return pages.write_static(directory)

    def workload_file(self, mix: str, config: Any = None) -> Path:
        path = Path(mixes.__file__).parent / "workloads" / f"{mix}.toml"
        if not path.exists():
            raise FileNotFoundError(f"no workload file for mix {mix!r} ({path})")
        return path

    def events(self, events_dir: Path) -> pa.Table:
        return collect_events(events_dir)


PROVIDER = RubbosProvider()
