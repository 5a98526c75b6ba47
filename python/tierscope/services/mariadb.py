"""MariaDB (Debian's mariadb-server): a server of its own (data directory, port, socket) under the
service's workdir, run in the foreground as the `mysql` OS user.

After start, a lab account `tierscope`/`tierscope` with all privileges from any address is created
(over the unix socket as root) so clients in other network namespaces can connect.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tierscope.services._accounts import give_to
from tierscope.services.base import Service, ServiceError, drop_socket_dir, socket_dir
from tierscope.testbed.host import Host

LAB_USER = "tierscope"
LAB_PASSWORD = "tierscope"


def _binary(*names: str) -> str:
    for n in names:
        found = shutil.which(n) or (f"/usr/sbin/{n}" if Path(f"/usr/sbin/{n}").exists() else None)
        if found:
            return found
    raise ServiceError(f"none of {names} found (is mariadb-server installed? run make setup)")


class MariaDB(Service):
    """A MariaDB server started in the foreground by tierscope."""

    kind = "mariadb"
    user = "mysql"
    start_timeout = 90.0

    def __init__(
        self,
        host: Host,
        port: int,
        workdir: str | Path,
        *,
        max_connections: int = 200,
        buffer_pool: str = "128M",
        durable: bool = True,
        settings: dict[str, str] | None = None,
        name: str | None = None,
    ):
        super().__init__(host, port, workdir, name)
        self.max_connections = max_connections
        self.buffer_pool = buffer_pool
        self.durable = durable
        self.settings = dict(settings or {})

    @property
    def data_dir(self) -> Path:
        return self.workdir / "data"

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
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        give_to(self.user, self.workdir)
        give_to(self.user, self.socket.parent)
        if not self.initialised():
            out = subprocess.run(
                [
                    _binary("mariadb-install-db", "mysql_install_db"),
                    f"--defaults-file={self.conf_path}",
                    f"--datadir={self.data_dir}",
                    f"--user={self.user}",
                    "--auth-root-authentication-method=normal",
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
        import os

        if os.geteuid() == 0:
            argv.append(f"--user={self.user}")
        return argv

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
        for stmt in (
            f"CREATE USER IF NOT EXISTS '{LAB_USER}'@'%' IDENTIFIED BY '{LAB_PASSWORD}'",
            f"GRANT ALL PRIVILEGES ON *.* TO '{LAB_USER}'@'%' WITH GRANT OPTION",
        ):
            self.sql(stmt)

    def connect_args(self, db: str | None = None) -> dict:
        """Keyword arguments for `pymysql.connect` reaching this server over TCP."""
        args = dict(host=self.host.address, port=self.port, user=LAB_USER, password=LAB_PASSWORD)
        if db:
            args["database"] = db
        return args

    def sql(self, statement: str, db: str | None = None, params: tuple | None = None) -> list[tuple]:
        """Run one statement as root over the socket; return its rows."""
        with self._root_connection(db) as conn, conn.cursor() as cur:
            cur.execute(statement, params)
            return list(cur.fetchall()) if cur.description else []

    def create_database(self, name: str) -> None:
        if not name.replace("_", "").isalnum():
            raise ValueError(f"database name {name!r}: letters, digits and _ only")
        self.sql(f"CREATE DATABASE IF NOT EXISTS `{name}`")

    def logs(self) -> dict[str, Path]:
        out = super().logs()
        if self.error_log.exists():
            out["error"] = self.error_log
        return out
