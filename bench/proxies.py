"""The peer proxies the benches run side by side with tierscope's middleware (bench/middleware,
bench/oltp): pgbouncer (a pooler, no replication) and pgpool-II (native replication), each started in
the foreground from a config of its own work directory, refusing a wrong password."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace


class Proxy:
    """A peer proxy (pgbouncer, pgpool-II) run in the foreground from a config of its own work
    directory (0700, its files 0600); started once its port answers."""

    name = ""

    def __init__(self, port: int, workdir: Path, backends: list[tuple[str, int]], database: str, pool: int):
        self.port, self.workdir, self.backends, self.database, self.pool = port, workdir, backends, database, pool
        self.host = SimpleNamespace(address="127.0.0.1")
        self.log_path = workdir / "console.log"
        self.proc = None

    def files(self, user: str, password: str) -> dict[str, str]:
        raise NotImplementedError

    def argv(self) -> list[str]:
        raise NotImplementedError

    def owner(self) -> str | None:
        return None

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.workdir, 0o700)
        for name, text in self.files(os.environ["PGUSER"], os.environ["PGPASSWORD"]).items():
            (self.workdir / name).write_text(text)
            os.chmod(self.workdir / name, 0o600)
        if self.owner():
            shutil.chown(self.workdir, self.owner())
            for f in self.workdir.iterdir():
                shutil.chown(f, self.owner())
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not _answers(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start:\n{self.log_path.read_text()[-3000:]}")
            time.sleep(0.05)
        self.check_credentials()

    def check_credentials(self) -> None:
        """A client with a wrong password is refused (the peer does not let anybody in)."""
        import psycopg

        try:
            psycopg.connect(
                host="127.0.0.1",
                port=self.port,
                user=os.environ["PGUSER"],
                password="not-the-password",
                dbname=self.database,
                connect_timeout=5,
            ).close()
        except psycopg.OperationalError:
            return
        self.stop()
        raise RuntimeError(f"{self.name} let a client in with a wrong password")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # both: fast shutdown
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _answers(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class PgBouncer(Proxy):
    """pgbouncer in front of db1 only (no replication), session mode: one server connection per
    client for the whole session, so prepared statements work."""

    name = "pgbouncer"

    def files(self, user: str, password: str) -> dict[str, str]:
        host, port = self.backends[0]
        return {
            "pgbouncer.ini": f"""[databases]
{self.database} = host={host} port={port} dbname={self.database}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = scram-sha-256
auth_file = {self.workdir}/userlist.txt
pool_mode = session
default_pool_size = {self.pool}
max_client_conn = 100
logfile = {self.workdir}/pgbouncer.log
pidfile = {self.workdir}/pgbouncer.pid
""",
            "userlist.txt": f'"{user}" "{password}"\n',
        }

    def owner(self) -> str:
        return "postgres"  # pgbouncer refuses to run as root

    def argv(self) -> list[str]:
        # its own -u, not runuser: the process started is pgbouncer itself, so the SIGINT of `stop`
        # reaches it (under runuser, runuser exited on it and left pgbouncer running)
        return [_binary("pgbouncer"), "-u", "postgres", str(self.workdir / "pgbouncer.ini")]


class PgPool(Proxy):
    """pgpool-II in native replication mode over both servers with load balancing: every write to
    both, reads balanced (weights 1:1), one backend connection per client process."""

    name = "pgpool-II"

    def files(self, user: str, password: str) -> dict[str, str]:
        backends = "".join(
            f"backend_hostname{i} = '{h}'\nbackend_port{i} = {p}\nbackend_weight{i} = 1\n"
            f"backend_flag{i} = 'DISALLOW_TO_FAILOVER'\n"
            for i, (h, p) in enumerate(self.backends)
        )
        w = self.workdir
        return {
            "pgpool.conf": f"""backend_clustering_mode = 'native_replication'
listen_addresses = '127.0.0.1'
port = {self.port}
unix_socket_directories = '{w}'
pcp_listen_addresses = ''
pcp_port = {self.port + 1}
pcp_socket_dir = '{w}'
{backends}load_balance_mode = on
replicate_select = off
num_init_children = {max(self.pool, 8)}
max_pool = 1
enable_pool_hba = on
pool_passwd = '{w}/pool_passwd'
logdir = '{w}'
pid_file_name = '{w}/pgpool.pid'
health_check_period = 0
sr_check_period = 0
failover_on_backend_error = off
log_min_messages = warning
""",
            "pool_passwd": f"{user}:TEXT{password}\n",
            "pcp.conf": "",
            "pool_hba.conf": "host all all 127.0.0.1/32 scram-sha-256\n",
        }

    def argv(self) -> list[str]:
        w = self.workdir
        return [
            _binary("pgpool"),
            "-n",
            "-f",
            str(w / "pgpool.conf"),
            "-F",
            str(w / "pcp.conf"),
            "-a",
            str(w / "pool_hba.conf"),
        ]


def _binary(name: str) -> str:
    found = shutil.which(name) or (f"/usr/sbin/{name}" if Path(f"/usr/sbin/{name}").exists() else None)
    if found is None:
        raise FileNotFoundError(name)
    return found


def installed(name: str) -> bool:
    try:
        _binary(name)
        return True
    except FileNotFoundError:
        return False
