"""PostgreSQL 15 (Debian binaries): a cluster of its own (data directory, port, socket directory)
under the service's workdir, run in the foreground as the `postgres` OS user.

Authentication (pg_hba.conf, rewritten at every start, also over a restored snapshot):
- TCP, on the host's own address only (`listen_addresses`): the lab user (`credentials`, see
  `tierscope.services.credentials`) with its password, scram-sha-256; nobody else, no `trust`.
- the unix socket, in a directory only the `postgres` OS user can enter (0700): the superuser
  `postgres` by peer authentication, for the OS users postgres and root (the lab's admin
  connection, `admin_dsn()`); nobody else.

After start the lab user is (re)made a non-superuser with the lab's password, and `database` (when
given) is created owned by it. Apps, loaders and benchmarks connect with `dsn(dbname)` or
`db_config(dbname)` (the lab user over TCP, password included); `sql()` runs as the lab user too,
`sql(..., admin=True)` and `create_database()` as the superuser over the socket.
"""

from __future__ import annotations

import glob
import os
import pwd
import signal
import subprocess
from pathlib import Path
from typing import Any, Unpack

from tierscope.services._accounts import DatabaseServer, ServerOptions, give_to, run_as
from tierscope.services.base import ServiceError, drop_socket_dir, private_dir, socket_dir
from tierscope.services.scram import ScramVerifier
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


class Postgres(DatabaseServer):
    """A PostgreSQL cluster started in the foreground by tierscope (its `database` is made, owned
    by the lab user, once it answers)."""

    kind = "postgres"
    dbms = "postgresql"
    user = "postgres"
    start_timeout = 60.0

    def __init__(
        self,
        host: Host,
        port: int,
        workdir: str | Path,
        *,
        shared_buffers: str = "128MB",
        fsync: bool = True,
        **options: Unpack[ServerOptions],
    ):
        super().__init__(host, port, workdir, **options)
        self.shared_buffers = shared_buffers
        self.fsync = fsync

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
        """A libpq connection string to `dbname` on this cluster as the lab user, over TCP (the
        password included: keep it out of command lines, pass it as PGPASSWORD, `credentials.env()`)."""
        import psycopg

        c = self.credentials
        return psycopg.conninfo.make_conninfo(
            host=self.host.address, port=self.port, user=c.user, password=c.password, dbname=dbname
        )

    def admin_dsn(self, dbname: str = "postgres") -> str:
        """A libpq connection string as the superuser over the unix socket (peer authentication:
        for the OS users root and postgres only)."""
        return f"host={self.socket_dir} port={self.port} user=postgres dbname={dbname}"

    def hba(self) -> str:
        """pg_hba.conf: the lab user by scram-sha-256 over TCP; the superuser by peer over the socket."""
        user = self.credentials.user
        return (
            "# written by tierscope: no trust; see tierscope.services.postgres\n"
            "local all postgres peer map=admin\n"
            f"host all {user} 0.0.0.0/0 scram-sha-256\n"
            f"host all {user} ::/0 scram-sha-256\n"
        )

    def ident(self) -> str:
        """pg_ident.conf: the OS users allowed to be the superuser over the socket."""
        users = {"postgres", "root", pwd.getpwuid(os.geteuid()).pw_name}
        return "# written by tierscope\n" + "".join(f"admin {u} postgres\n" for u in sorted(users))

    def conf(self) -> str:
        lines = {
            "listen_addresses": f"'{self.host.address}'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.socket_dir}'",
            "unix_socket_permissions": "0700",
            "password_encryption": "'scram-sha-256'",
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
        private_dir(self.socket_dir, self.user)
        give_to(self.user, self.workdir)
        _ = self.credentials  # made before the server starts, beside the workdir
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
                        "--auth-local=peer",
                        "--auth-host=scram-sha-256",
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
        # also over a restored snapshot's (older snapshots trusted everyone)
        (self.data_dir / "pg_hba.conf").write_text(self.hba())
        (self.data_dir / "pg_ident.conf").write_text(self.ident())
        (self.data_dir / "postgresql.auto.conf").write_text(self.conf())
        give_to(self.user, self.workdir)

    def command(self) -> list[str]:
        return run_as(self.user, [str(pg_bindir() / "postgres"), "-D", str(self.data_dir)])

    def healthy(self) -> bool:
        try:
            import psycopg

            with psycopg.connect(self.admin_dsn(), connect_timeout=1) as conn:
                conn.execute("select 1")
            return True
        except Exception:
            return False

    def after_start(self) -> None:
        """(Re)make the lab user, a non-superuser with the lab's password, and the lab's database
        owned by it."""
        from psycopg import sql as q

        c = self.credentials  # sent as its SCRAM verifier: the password is never in a statement
        role = q.Identifier(c.user)
        exists = self.sql("select 1 from pg_roles where rolname = %s", params=(c.user,), admin=True)
        self.sql(
            q.SQL(
                "{} ROLE {} WITH LOGIN NOSUPERUSER NOCREATEROLE NOREPLICATION NOBYPASSRLS CREATEDB PASSWORD {}"
            ).format(
                q.SQL("ALTER" if exists else "CREATE"), role, q.Literal(ScramVerifier(c.password).postgres_secret())
            ),
            admin=True,
        )
        if self.database:
            self.create_database(self.database)

    def stop(self, timeout: float = 30.0) -> None:
        # SIGINT = "fast" shutdown: abort sessions, checkpoint, exit.
        self.stop_signal = signal.SIGINT
        super().stop(timeout)
        drop_socket_dir(self.socket_dir, self.workdir)

    #: client sessions inside a statement or a transaction ("idle in transaction" holds its connection)
    busy_sessions_sql = (
        "select count(*) from pg_stat_activity where backend_type = 'client backend'"
        " and state is not null and state <> 'idle' and pid <> pg_backend_pid()"
    )
    #: max_connections less the slots kept for superusers and less the probe's own session (a
    #: superuser's session counts against every client's limit)
    client_sessions_sql = (
        "select current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int - 1"
    )

    def admin_connection(self) -> Any:
        import psycopg

        return psycopg.connect(self.admin_dsn(), autocommit=True)

    def sql(self, statement, db: str = "postgres", params: tuple | None = None, *, admin: bool = False) -> list[tuple]:
        """Run one statement (autocommit) as the lab user over TCP, or as the superuser over the
        socket with `admin` (CHECKPOINT, roles, databases), and return its rows ([] when none)."""
        import psycopg

        with psycopg.connect(self.admin_dsn(db) if admin else self.dsn(db), autocommit=True) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def create_database(self, name: str) -> None:
        """Create database `name` owned by the lab user (no error if it exists; one of an older
        snapshot, made by the superuser, is given to the lab user with its tables)."""
        from psycopg import sql as q

        user = self.credentials.user
        owner = self.sql(
            "select pg_get_userbyid(datdba) from pg_database where datname = %s", params=(name,), admin=True
        )
        if not owner:
            self.sql(q.SQL("create database {} owner {}").format(q.Identifier(name), q.Identifier(user)), admin=True)
            return
        if owner[0][0] != user:
            self.sql(q.SQL("alter database {} owner to {}").format(q.Identifier(name), q.Identifier(user)), admin=True)
        self.sql(_GIVE_TABLES.replace("LAB_USER", user), db=name, admin=True)

    def logs(self) -> dict[str, Path]:
        return super().logs()


#: gives the lab user (LAB_USER) every table, view and free-standing sequence of schema public it
#: does not own yet (a database made by the superuser before the lab had its own user)
_GIVE_TABLES = """
DO $$ DECLARE r record; BEGIN
  FOR r IN SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'S')
             AND pg_get_userbyid(c.relowner) <> 'LAB_USER'
             AND NOT (c.relkind = 'S' AND EXISTS (
                 SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                 AND d.deptype IN ('a', 'i')))
  LOOP
    EXECUTE format('ALTER %s public.%I OWNER TO %I',
      CASE r.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW' ELSE 'TABLE' END,
      r.relname, 'LAB_USER');
  END LOOP;
END $$
"""
