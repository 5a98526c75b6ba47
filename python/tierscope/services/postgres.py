"""PostgreSQL 15 (Debian binaries): a cluster of its own (data directory, port, socket directory)
under the service's workdir, run in the foreground as the `postgres` OS user.

Authentication is `trust` for every connection: it is a lab database on an isolated network.
Connect as the superuser `postgres` with `dsn(dbname)`.
"""

from __future__ import annotations

import glob
import os
import subprocess
from pathlib import Path

from tierscope.services._accounts import give_to, run_as
from tierscope.services.base import Service, ServiceError, drop_socket_dir, socket_dir
from tierscope.testbed.host import Host


def pg_bindir() -> Path:
    """The directory of the newest installed PostgreSQL server binaries."""
    override = os.environ.get("TIERSCOPE_PG_BINDIR")
    if override:
        return Path(override)
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    if not found:
        raise ServiceError("PostgreSQL server binaries not found under /usr/lib/postgresql (run make setup)")
    return Path(found[-1]).parent


class Postgres(Service):
    """A PostgreSQL cluster started in the foreground by tierscope."""

    kind = "postgres"
    user = "postgres"
    start_timeout = 60.0

    def __init__(
        self,
        host: Host,
        port: int,
        workdir: str | Path,
        *,
        max_connections: int = 200,
        shared_buffers: str = "128MB",
        fsync: bool = True,
        settings: dict[str, str] | None = None,
        name: str | None = None,
    ):
        super().__init__(host, port, workdir, name)
        self.max_connections = max_connections
        self.shared_buffers = shared_buffers
        self.fsync = fsync
        self.settings = dict(settings or {})

    @property
    def data_dir(self) -> Path:
        return self.workdir / "data"

    def table_files(self) -> list[Path]:
        """The files of the tables and indexes (`base/`), not the write-ahead log."""
        return sorted(p for p in (self.data_dir / "base").rglob("*") if p.is_file())

    @property
    def socket_dir(self) -> Path:
        return socket_dir(self.workdir, f".s.PGSQL.{self.port}.lock")

    @property
    def log_file(self) -> Path:
        return self.workdir / "postgres.log"

    def dsn(self, dbname: str = "postgres") -> str:
        """A libpq connection string to this cluster as the superuser."""
        return f"host={self.host.address} port={self.port} user=postgres dbname={dbname}"

    def conf(self) -> str:
        lines = {
            "listen_addresses": f"'{self.host.address}'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.socket_dir}'",
            "max_connections": str(self.max_connections),
            "shared_buffers": f"'{self.shared_buffers}'",
            "fsync": "on" if self.fsync else "off",
            "synchronous_commit": "on" if self.fsync else "off",
            "full_page_writes": "on" if self.fsync else "off",
            "logging_collector": "off",
            "log_min_messages": "warning",
        }
        lines.update(self.settings)
        return "# written by tierscope\n" + "".join(f"{k} = {v}\n" for k, v in lines.items())

    def initialised(self) -> bool:
        return (self.data_dir / "PG_VERSION").exists()

    def prepare(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        give_to(self.user, self.workdir)
        give_to(self.user, self.socket_dir)
        if not self.initialised():
            out = subprocess.run(
                run_as(
                    self.user,
                    [
                        str(pg_bindir() / "initdb"),
                        "-D",
                        str(self.data_dir),
                        "-U",
                        "postgres",
                        "--auth=trust",
                        "--encoding=UTF8",
                        "--locale=C",
                        "--no-sync",
                    ],
                ),
                capture_output=True,
                text=True,
            )
            if out.returncode != 0:
                raise ServiceError(f"{self.name}: initdb failed:\n{out.stdout}\n{out.stderr}")
            hba = self.data_dir / "pg_hba.conf"
            hba.write_text("local all all trust\nhost all all 0.0.0.0/0 trust\nhost all all ::/0 trust\n")
        (self.data_dir / "postgresql.auto.conf").write_text(self.conf())
        give_to(self.user, self.workdir)

    def command(self) -> list[str]:
        return run_as(self.user, [str(pg_bindir() / "postgres"), "-D", str(self.data_dir)])

    def healthy(self) -> bool:
        try:
            import psycopg

            with psycopg.connect(self.dsn(), connect_timeout=1) as conn:
                conn.execute("select 1")
            return True
        except Exception:
            return False

    def stop(self, timeout: float = 30.0) -> None:
        # SIGINT = "fast" shutdown: abort sessions, checkpoint, exit.
        import signal

        self.stop_signal = signal.SIGINT
        super().stop(timeout)
        drop_socket_dir(self.socket_dir, self.workdir)

    def sql(self, statement: str, db: str = "postgres", params: tuple | None = None) -> list[tuple]:
        """Run one statement (autocommit) and return its rows ([] when it returns none)."""
        import psycopg

        with psycopg.connect(self.dsn(db), autocommit=True) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def create_database(self, name: str) -> None:
        """Create database `name` (no error if it exists)."""
        if not self.sql("select 1 from pg_database where datname = %s", params=(name,)):
            from psycopg import sql as q
            import psycopg

            with psycopg.connect(self.dsn(), autocommit=True) as conn:
                conn.execute(q.SQL("create database {}").format(q.Identifier(name)))

    def logs(self) -> dict[str, Path]:
        return super().logs()
