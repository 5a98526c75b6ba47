"""The database servers the lab runs, behind one factory: `database_server(dbms, ...)` gives the
server (not started) and the configuration an app uses to reach it. The runner and the apps ask
here instead of knowing PostgreSQL's, MariaDB's or Galera's classes, ports, users and wire protocols.

Galera (`galera`) is MariaDB with the Galera provider: each database server of the tier is one node
of one cluster (the servers of a runner point, `<point>/db1`, `<point>/db2`, ..., form one), node 1
bootstraps it and the others join as they start (tierscope.services.galera). Its data is MariaDB's
(`data_dbms`), and an app reaches every node of the cluster through `client_config`."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

from tierscope.contracts import dbms as dbms_table
from tierscope.contracts.dbms import DbConfig
from tierscope.services import galera
from tierscope.services.base import Service
from tierscope.services.credentials import Credentials, lab_credentials
from tierscope.services.galera import cluster_serving, node_of
from tierscope.services.mariadb import MariaDB
from tierscope.services.postgres import Postgres, pg_bindir
from tierscope.testbed.host import Host

#: the DBMS names of the services and of `DbConfig` (a spec's "postgres" is "postgresql" here);
#: the vocabulary is tierscope.contracts.dbms's one table
DBMS = dbms_table.NAMES
#: the port a database server listens on inside its own host
PORT = {d.name: d.port for d in dbms_table.TABLE}
#: the wire protocol the passive tracer decodes for it
PROTOCOL = {d.name: d.protocol for d in dbms_table.TABLE}
#: the DBMS whose data files (and loaded snapshots) a DBMS uses
DATA_DBMS = {d.name: d.data for d in dbms_table.TABLE}


def dbms_name(spec_dbms: str) -> str:
    """A spec's DBMS (`postgres`, `mariadb`) as the services name it (an unknown name unchanged)."""
    try:
        return dbms_table.dbms(spec_dbms).name
    except ValueError:
        return spec_dbms


def data_dbms(dbms: str) -> str:
    """The DBMS whose data directory `dbms` (a services name) starts from: a Galera node starts
    from a MariaDB snapshot, so Galera and MariaDB points share one loaded data set."""
    return DATA_DBMS.get(dbms, dbms)


def client_config(db: DbConfig) -> DbConfig:
    """What an app server uses to reach the database `db` names: for a node of a running Galera
    cluster, every running node (`host` = "addr:port,addr:port,...": the app's pool spreads its
    sessions over them round robin, tierscope.apps.dal); otherwise `db` itself."""
    cluster = cluster_serving(db.host, db.port)
    return replace(db, host=cluster.client_hosts()) if cluster is not None else db


def database_server(
    dbms: str,
    host: Host,
    port: int,
    workdir: Path,
    *,
    database: str,
    fsync: bool = False,
    cache: str = "256M",
    max_connections: int = 300,
    name: str | None = None,
    credentials: Credentials | None = None,
) -> tuple[Service, DbConfig]:
    """The server of `dbms` (not started) and the app's configuration to reach `database` on it.

    `cache` is shared_buffers / innodb_buffer_pool_size as "<n>M". A `galera` server is a new node
    of the cluster of the servers whose workdirs are beside `workdir` (`galera.node_of`).
    `credentials`: the lab user and password the server requires and the configuration carries
    (default: the lab's file beside `workdir`, `credentials.lab_credentials(workdir.parent)`, so
    the servers of one point or lab share them)."""
    creds = credentials or lab_credentials(Path(workdir).absolute().parent)
    if dbms == "postgresql":
        svc: Service = Postgres(
            host,
            port,
            workdir,
            fsync=fsync,
            shared_buffers=cache.replace("M", "MB"),
            max_connections=max_connections,
            name=name,
            credentials=creds,
            database=database,
        )
    elif dbms == "mariadb":
        svc = MariaDB(
            host,
            port,
            workdir,
            durable=fsync,
            buffer_pool=cache,
            max_connections=max_connections,
            name=name,
            credentials=creds,
            database=database,
        )
    elif dbms == "galera":
        svc = node_of(
            host,
            port,
            workdir,
            durable=fsync,
            buffer_pool=cache,
            max_connections=max_connections,
            name=name,
            credentials=creds,
            database=database,
        )
    else:
        raise ValueError(f"dbms: expected one of {', '.join(DBMS)}, got {dbms!r}")
    return svc, DbConfig(
        DATA_DBMS[dbms],
        host=host.address,
        port=port,
        user=creds.user,
        password=creds.password,
        database=database,
    )
    raise ValueError(f"dbms: expected one of {', '.join(DBMS)}, got {dbms!r}")


#: the Debian packages each DBMS's server comes from (what `make setup` installs)
PACKAGES = {"postgresql": ["postgresql-15"], "mariadb": ["mariadb-server"], "galera": ["mariadb-server", "galera-4"]}


def missing_packages(dbms: str) -> list[str]:
    """The packages of `PACKAGES[dbms]` whose programs this host lacks (empty: it can run the DBMS)."""
    if dbms not in DBMS:
        raise ValueError(f"dbms: expected one of {', '.join(DBMS)}, got {dbms!r}")
    binaries = server_binaries()
    have = {
        "postgresql-15": binaries["postgres"] is not None and Path(binaries["postgres"]).exists(),
        "mariadb-server": bool(shutil.which("mariadbd") or shutil.which("mysqld")),
        "galera-4": Path(galera.PROVIDER_LIBRARY).exists(),
    }
    return [p for p in PACKAGES[dbms] if not have[p]]


def server_binaries() -> dict[str, str | None]:
    """The server program of each DBMS by the manifest's name for it (None when not installed)."""
    try:
        postgres: str | None = str(pg_bindir() / "postgres")
    except Exception:  # not installed: the manifest says None
        postgres = None
    return {"postgres": postgres, "mariadb": shutil.which("mariadbd") or "mariadbd"}
