"""Redis (Debian's redis-server): a server of its own (data directory, port, append-only file)
under the `redis` OS user. The log service's `durable` mode keeps its queue in a Redis stream, so a
record acknowledged by the app survives a crash of the app (the broker is another process).

Durability (`appendfsync`): with `always` (the default) Redis writes and fsyncs its append-only
file before it answers a write, so an acknowledged XADD survives a kill -9 of the broker and a crash
of its host (Redis groups the writes of one event-loop turn into one fsync). With `everysec` the
append-only file is fsynced once a second, and a write may be postponed up to 2 s while an fsync
is still running: a crash of the host loses up to the last 2 s of acknowledged writes.

Access: the server listens on its host's address only and requires a password (`requirepass`),
a secret generated per server (per run) unless given. It is kept in `redis.conf` (0600, owned by
the redis user) and in `password_file` (0600, owned by whoever runs the lab), never on a command
line. Clients take `url` (which carries it) or `password`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
from pathlib import Path
from urllib.parse import quote

from tierscope.services._accounts import give_to, run_as
from tierscope.services.base import Service, ServiceError
from tierscope.testbed.host import Host

APPENDFSYNC = ("always", "everysec", "no")


def redis_server() -> str:
    path = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not Path(path).exists():
        raise ServiceError("redis-server is not installed (Debian package redis-server; `make setup` installs it)")
    return path


def write_secret(path: Path, text: str) -> None:
    """Write `text` to `path` readable by its owner only (0600 from the start, no symlink followed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


class Redis(Service):
    """redis-server on host:port with an append-only file in `workdir/data` and a password."""

    kind = "redis"
    user = "redis"
    start_timeout = 30.0

    def __init__(
        self,
        host: Host,
        port: int,
        workdir: str | Path,
        *,
        appendfsync: str = "always",
        password: str | None = None,
        name: str | None = None,
    ):
        if appendfsync not in APPENDFSYNC:
            raise ValueError(f"appendfsync: expected one of {', '.join(APPENDFSYNC)}, got {appendfsync!r}")
        super().__init__(host, port, workdir, name)
        self.appendfsync = appendfsync
        self.password = password or secrets.token_urlsafe(32)

    @property
    def data_dir(self) -> Path:
        return self.workdir / "data"

    @property
    def conf_path(self) -> Path:
        return self.workdir / "redis.conf"

    @property
    def password_file(self) -> Path:
        """The password alone (0600, the lab's user): what a user of the lab is pointed to."""
        return self.workdir / "redis.password"

    @property
    def log_file(self) -> Path:
        return self.workdir / "redis.log"

    @property
    def url(self) -> str:
        return f"redis://:{quote(self.password, safe='')}@{self.host.address}:{self.port}/0"

    def conf(self) -> str:
        opts = {
            "bind": self.host.address,
            "port": str(self.port),
            "protected-mode": "yes",
            "requirepass": self.password,
            "daemonize": "no",
            "dir": str(self.data_dir),
            "logfile": str(self.log_file),
            "appendonly": "yes",
            "appendfsync": self.appendfsync,
            "save": '""',
            "unixsocket": '""',
        }
        return "# written by tierscope\n" + "".join(f"{k} {v}\n" for k, v in opts.items())

    def prepare(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        write_secret(self.conf_path, self.conf())
        give_to(self.user, self.workdir)
        os.chmod(self.workdir, 0o700)
        write_secret(self.password_file, self.password + "\n")  # after give_to: stays the lab's

    def command(self) -> list[str]:
        return run_as(self.user, [redis_server(), str(self.conf_path)])

    def healthy(self) -> bool:
        try:
            with socket.create_connection((self.host.address, self.port), timeout=0.5) as s:
                pw = self.password.encode()
                s.sendall(b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\nPING\r\n" % (len(pw), pw))
                got = b""
                while got.count(b"\r\n") < 2:
                    chunk = s.recv(64)
                    if not chunk:
                        break
                    got += chunk
                return got.startswith(b"+OK\r\n+PONG")
        except OSError:
            return False

    def logs(self) -> dict[str, Path]:
        out = super().logs()
        if self.log_file.exists():
            out["log"] = self.log_file
        return out
