"""What the runner, the assembly and the app server need of an application (a system under test),
as typed Protocols: `AppProvider` (how to load its data, put it into a database server, run its app
server, write its static pages, find its workload files and read its events) and `WsgiApp` (how
the app server runs it). The providers live in tierscope.apps; the services and the assembly see
them only through these."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

from tierscope.contracts.dbms import DbConfig


class WsgiApp(Protocol):
    """A WSGI application as the app server (`services.appserver.AppServer`) runs it against a
    database: its entry point ("module:factory()"), the path that answers 200 once it serves, the
    environment that configures it for one server (`env(server)`: from the server's `db`, name,
    events directory and pauses) and the reader of the events it records (`events(events_dir)`)."""

    @property
    def entry(self) -> str: ...
    @property
    def health_path(self) -> str: ...
    @property
    def env(self) -> Callable[[Any], dict[str, str]]: ...
    @property
    def events(self) -> Callable[[Path], pa.Table]: ...


class AppProvider(Protocol):
    """What the runner needs of a system under test's application (tierscope.apps's docstring).
    `config` is a runner point's configuration (`spec.PointConfig`), `host` a testbed host."""

    name: str

    def data_key(self, config: Any) -> tuple[Any, ...]:
        """What the loaded data depends on (points with the same key share one load)."""
        ...

    def prepare_data(self, config: Any, work: Path, say: Callable[[str], None]) -> Path:
        """Load the data for `config` once (or reuse a snapshot); the loaded data directory."""
        ...

    def database_server(
        self,
        dbms: str,
        host: Any,
        port: int,
        workdir: Path,
        *,
        cache: str,
        max_connections: int,
        name: str | None,
        fsync: bool = False,
    ) -> tuple[Any, DbConfig]:
        """The database server (not started) holding the app's database, and its `DbConfig`."""
        ...

    def restore(self, data_dir: Path, server: Any) -> None:
        """Put the loaded data into a (stopped) database server's data directory."""
        ...

    def app_server(
        self, host: Any, port: int, workdir: Path, *, db: DbConfig, soft: Any, events_dir: Path, name: str | None
    ) -> Any:
        """The app server (not started) running the application against `db`."""
        ...

    def static_root(self, directory: Path, config: Any = None) -> Path:
        """Write the static content for `config` (a PointConfig) under `directory`; the document
        root nginx serves."""
        ...

    def workload_file(self, mix: str, config: Any = None) -> Path:
        """The generator's workload file for `mix` at the data set of `config` (a PointConfig;
        FileNotFoundError when there is none)."""
        ...

    def events(self, events_dir: Path) -> pa.Table:
        """The app's own events (GC, injected pauses) written under `events_dir`, as an events table."""
        ...
