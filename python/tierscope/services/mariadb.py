"""MariaDB (Debian's mariadb-server): a server of its own (data directory, port, socket) under the
service's workdir, run in the foreground as the `mysql` OS user.

Authentication: root logs in by unix_socket only (the OS user root, the lab's admin connection
over the socket; no password, not over TCP), and the socket is in a directory only the `mysql` OS
user can enter (0700). The server listens on its host's address only (`bind-address`). After start
the lab user (`credentials`, see `tierscope.services.credentials`) is (re)made from any address with
the lab's password (mysql_native_password) and privileges on the lab's `database` only (and on the
databases made with `create_database`), so clients in other network namespaces can connect.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Unpack

from tierscope.services._accounts import DatabaseServer, ServerOptions, give_to
from tierscope.services.base import ServiceError, drop_socket_dir, private_dir, socket_dir
from tierscope.services.credentials import LAB_USER
from tierscope.testbed.host import Host

__all__ = ["LAB_USER", "MariaDB"]


def _binary(*names: str) -> str:
    for n in names:
        found = shutil.which(n) or (f"/usr/sbin/{n}" if Path(f"/usr/sbin/{n}").exists() else None)
        if found:
            return found
    raise ServiceError(f"none of {names} found (is mariadb-server installed? run make setup)")


class MariaDB(DatabaseServer):
    """A MariaDB server started in the foreground by tierscope (the lab user's privileges are on
    its `database` and on the databases made with `create_database`)."""

    kind = "mariadb"
    dbms = "mariadb"
    user = "mysql"
    start_timeout = 90.0

    def __init__(
        self,
        host: Host,
        port: int,
        workdir: str | Path,
        *,
        buffer_pool: str = "128M",
        durable: bool = True,
        **options: Unpack[ServerOptions],
    ):
        super().__init__(host, port, workdir, **options)
        self.buffer_pool = buffer_pool
        self.durable = durable

    def table_files(self) -> list[Path]:
        """The files of the tables and indexes (InnoDB's system and per-table spaces), not the redo
        log or the binary logs."""
        return sorted(
            p for p in self.data_dir.rglob("*") if p.is_file() and (p.suffix == ".ibd" or p.name.startswith("ibdata"))
        )

    @property
    def socket(self) -> Path:
        return socket_dir(self.workdir, "mysqld.sock") / "mysqld.sock"

    @property
    def conf_path(self) -> Path:
        return self.workdir / "my.cnf"

    @property
    def error_log(self) -> Path:
        return self.workdir / "error.log"

    def conf(self) -> str:
        opts = {
            "datadir": str(self.data_dir),
            "socket": str(self.socket),
            "port": str(self.port),
            "bind-address": self.host.address,
            "pid-file": str(self.workdir / "mysqld.pid"),
            "log-error": str(self.error_log),
            "max_connections": str(self.max_connections),
            "innodb_buffer_pool_size": self.buffer_pool,
            "innodb_flush_log_at_trx_commit": "1" if self.durable else "2",
            "skip-name-resolve": "1",
            "local-infile": "1",
            "character-set-server": "utf8mb4",
        }
        opts.update(self.settings)
        return "[mysqld]\n" + "".join(f"{k} = {v}\n" for k, v in opts.items())

    def initialised(self) -> bool:
        return (self.data_dir / "mysql").is_dir()

    def prepare(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.conf_path.write_text(self.conf())
        private_dir(self.socket.parent, self.user)
        give_to(self.user, self.workdir)
        _ = self.credentials  # made before the server starts, beside the workdir
        if not self.initialised():
            out = subprocess.run(
                [
                    _binary("mariadb-install-db", "mysql_install_db"),
                    f"--defaults-file={self.conf_path}",
                    f"--datadir={self.data_dir}",
                    f"--user={self.user}",
                    "--auth-root-authentication-method=socket",
                    "--skip-test-db",
                ],
                capture_output=True,
                text=True,
            )
            if out.returncode != 0:
                raise ServiceError(f"{self.name}: mariadb-install-db failed:\n{out.stdout}\n{out.stderr}")
            give_to(self.user, self.workdir)

    def stop(self, timeout: float = 20.0) -> None:
        super().stop(timeout)
        drop_socket_dir(self.socket.parent, self.workdir)

    def command(self) -> list[str]:
        argv = [_binary("mariadbd", "mysqld"), f"--defaults-file={self.conf_path}"]
        if os.geteuid() == 0:
            argv.append(f"--user={self.user}")
        return argv

    #: client sessions inside a statement, or between the statements of an open InnoDB transaction
    #: (shown as Sleep then); the server's own threads (Galera's "system user") are not clients
    busy_sessions_sql = (
        "select count(*) from information_schema.PROCESSLIST where ID <> connection_id()"
        " and USER not in ('system user', 'event_scheduler') and COMMAND not in ('Daemon', 'Binlog Dump')"
        " and (COMMAND <> 'Sleep' or ID in (select trx_mysql_thread_id from information_schema.INNODB_TRX))"
    )
    #: max_connections less the probe's own session (it counts against every client's limit)
    client_sessions_sql = "select @@max_connections - 1"

    def admin_connection(self) -> Any:
        return self._root_connection()

    def _root_connection(self, db: str | None = None):
        import pymysql

        return pymysql.connect(
            unix_socket=str(self.socket),
            user="root",
            password="",
            database=db,
            autocommit=True,
            connect_timeout=2,
            local_infile=True,
        )

    def healthy(self) -> bool:
        try:
            with self._root_connection() as conn, conn.cursor() as cur:
                cur.execute("select 1")
            return True
        except Exception:
            return False

    def after_start(self) -> None:
        """Root by unix_socket only (a data directory of an older snapshot had root without a
        password, also over TCP); the lab user with the lab's password and privileges on the lab's
        database only."""
        self.lock_root()
        c = self.credentials
        # as mysql_native_password's hash: the password itself is never in a statement
        hashed = "*" + hashlib.sha1(hashlib.sha1(c.password.encode()).digest()).hexdigest().upper()
        self.sql("CREATE USER IF NOT EXISTS %s@'%%' IDENTIFIED BY PASSWORD %s", params=(c.user, hashed))
        self.sql("ALTER USER %s@'%%' IDENTIFIED BY PASSWORD %s", params=(c.user, hashed))
        # no global privilege (older snapshots gave it ALL ON *.* WITH GRANT OPTION); the grants on
        # databases this lab made (`grant`) stay
        self.sql("REVOKE ALL PRIVILEGES ON *.* FROM %s@'%%'", params=(c.user,))
        self.sql("REVOKE GRANT OPTION ON *.* FROM %s@'%%'", params=(c.user,))
        if self.database:
            self.create_database(self.database)

    def lock_root(self) -> None:
        """Leave root@localhost by unix_socket only and no other root, anonymous or test account."""
        for user, host in self.sql(
            "SELECT user, host FROM mysql.global_priv WHERE (user = 'root' AND host <> 'localhost') OR user = ''"
        ):
            self.sql("DROP USER %s@%s", params=(user, host))
        self.sql("ALTER USER 'root'@'localhost' IDENTIFIED VIA unix_socket")

    def grant(self, database: str) -> None:
        """Give the lab user every privilege on `database` (none on any other, none to grant)."""
        _check_name(database)
        self.sql(f"GRANT ALL PRIVILEGES ON `{database}`.* TO %s@'%%'", params=(self.credentials.user,))

    def connect_args(self, db: str | None = None) -> dict:
        """Keyword arguments for `pymysql.connect` reaching this server over TCP as the lab user."""
        c = self.credentials
        args = dict(host=self.host.address, port=self.port, user=c.user, password=c.password)
        if db:
            args["database"] = db
        return args

    def sql(self, statement: str, db: str | None = None, params: tuple | None = None) -> list[tuple]:
        """Run one statement as root over the socket; return its rows."""
        with self._root_connection(db) as conn, conn.cursor() as cur:
            cur.execute(statement, params)
            return list(cur.fetchall()) if cur.description else []

    def create_database(self, name: str) -> None:
        """Create database `name` (no error if it exists) and give the lab user its privileges."""
        _check_name(name)
        self.sql(f"CREATE DATABASE IF NOT EXISTS `{name}`")
        self.grant(name)

    def logs(self) -> dict[str, Path]:
        out = super().logs()
        if self.error_log.exists():
            out["error"] = self.error_log
        return out


def _check_name(name: str) -> None:
    if not name.replace("_", "").isalnum():
        raise ValueError(f"database name {name!r}: letters, digits and _ only")
