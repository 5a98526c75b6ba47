"""The database servers the lab runs, behind one factory: `database_server(dbms, ...)` gives the
server (not started) and the configuration an app uses to reach it. The runner and the apps ask
here instead of knowing PostgreSQL's or MariaDB's classes, ports, users and wire protocols."""

from __future__ import annotations

from pathlib import Path

from tierscope.apps.dal import DbConfig
from tierscope.services.base import Service
from tierscope.testbed.host import Host

#: the DBMS names of the services and of `DbConfig` (a spec's "postgres" is "postgresql" here)
DBMS = ("postgresql", "mariadb")
#: the port a database server listens on inside its own host
PORT = {"postgresql": 5432, "mariadb": 3306}
#: the wire protocol the passive tracer decodes for it
PROTOCOL = {"postgresql": "postgres", "mariadb": "mysql"}


def dbms_name(spec_dbms: str) -> str:
    """A spec's DBMS (`postgres`, `mariadb`) as the services name it."""
    return "postgresql" if spec_dbms in ("postgres", "postgresql") else spec_dbms


def database_server(dbms: str, host: Host, port: int, workdir: Path, *, database: str, fsync: bool = False,
                    cache: str = "256M", max_connections: int = 300,
                    name: str | None = None) -> tuple[Service, DbConfig]:
    """The server of `dbms` (not started) and the app's configuration to reach `database` on it.

    `cache` is shared_buffers / innodb_buffer_pool_size as "<n>M"."""
    if dbms == "postgresql":
        from tierscope.services.postgres import Postgres

        svc = Postgres(host, port, workdir, fsync=fsync, shared_buffers=cache.replace("M", "MB"),
                       max_connections=max_connections, name=name)
        return svc, DbConfig("postgresql", host=host.address, port=port, user="postgres", password="",
                             database=database)
    if dbms == "mariadb":
        from tierscope.services.mariadb import LAB_PASSWORD, LAB_USER, MariaDB

        svc = MariaDB(host, port, workdir, durable=fsync, buffer_pool=cache, max_connections=max_connections,
                      name=name)
        return svc, DbConfig("mariadb", host=host.address, port=port, user=LAB_USER, password=LAB_PASSWORD,
                             database=database)
    raise ValueError(f"dbms: expected one of {', '.join(DBMS)}, got {dbms!r}")


def server_binaries() -> dict[str, str | None]:
    """The server program of each DBMS by the manifest's name for it (None when not installed)."""
    import shutil

    try:
        from tierscope.services.postgres import pg_bindir

        postgres: str | None = str(pg_bindir() / "postgres")
    except Exception:  # not installed: the manifest says None
        postgres = None
    return {"postgres": postgres, "mariadb": shutil.which("mariadbd") or "mariadbd"}
