"""The DBMS vocabulary, one table for the spec, the services, the apps and the middleware: each
DBMS the lab runs with its name (as the services and `DbConfig` say it), the name a spec uses
(`topology.db.dbms`) and its notation letter, the wire protocol the tracer and the middleware speak
to it, the port it listens on inside its host, and the DBMS whose data files and client it shares.

Adding a DBMS means one row here (and its service class); `DbConfig` is what an app, the
middleware or a load generator needs to reach a database."""

from __future__ import annotations

from dataclasses import dataclass

#: the database user of the lab's apps, loaders, benchmarks and middleware (never a superuser);
#: its password is per lab or run (`services.credentials`)
LAB_USER = "tierscope"


@dataclass(frozen=True)
class Dbms:
    """One DBMS of the lab (see the module docstring)."""

    #: as the services and `DbConfig` name it: "postgresql", "mariadb", "galera"
    name: str
    #: as a spec names it (`topology.db.dbms`): "postgres", "mariadb", "galera"
    spec: str
    #: its letter in the topology notation (`1P`, `1M`, `1G`)
    letter: str
    #: the wire protocol the passive tracer decodes and the middleware speaks: "postgres", "mysql"
    protocol: str
    #: the port its server listens on inside its own host
    port: int
    #: the DBMS whose data files (loaded snapshots) and client it uses: Galera is MariaDB's
    data: str


#: every DBMS the lab runs
TABLE: tuple[Dbms, ...] = (
    Dbms("postgresql", "postgres", "P", "postgres", 5432, "postgresql"),
    Dbms("mariadb", "mariadb", "M", "mysql", 3306, "mariadb"),
    Dbms("galera", "galera", "G", "mysql", 3306, "mariadb"),
)
#: by the services' name
BY_NAME: dict[str, Dbms] = {d.name: d for d in TABLE}
#: the DBMS names of the services ("postgresql", "mariadb", "galera")
NAMES: tuple[str, ...] = tuple(BY_NAME)
#: the DBMS a client (an app's pool, `DbConfig`) connects to: one per wire protocol
CLIENT_NAMES: tuple[str, ...] = tuple(dict.fromkeys(d.data for d in TABLE))


def dbms(name: str) -> Dbms:
    """The DBMS a services name or a spec name (`postgres`) names; ValueError naming the known."""
    for d in TABLE:
        if name in (d.name, d.spec):
            return d
    raise ValueError(f"dbms: expected one of {', '.join(NAMES)}, got {name!r}")


@dataclass(frozen=True)
class DbConfig:
    """How a client reaches one database: its DBMS (a client name, `CLIENT_NAMES`), host (or a
    list "addr:port,addr:port" the pool spreads its sessions over), port, user, password, database,
    and the pool's size and timeout."""

    dbms: str = "postgresql"
    host: str = "127.0.0.1"
    port: int = 5432
    user: str = "postgres"
    password: str = ""
    database: str = "rubbos"
    pool_size: int = 8
    pool_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.dbms not in CLIENT_NAMES:
            raise ValueError(f"dbms: expected one of {CLIENT_NAMES}, got {self.dbms!r}")
        if self.pool_size < 1:
            raise ValueError(f"pool_size: expected >= 1, got {self.pool_size}")
