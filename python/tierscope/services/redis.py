"""Redis (Debian's redis-server): a server of its own (data directory, port, append-only file)
under the `redis` OS user. The log service's `durable` mode keeps its queue in a Redis stream, so a
record acknowledged by the app survives a crash of the app (the broker is another process); with
`appendfsync = "always"` it also survives a crash of the broker's host.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

from tierscope.services._accounts import give_to, run_as
from tierscope.services.base import Service, ServiceError
from tierscope.testbed.host import Host

APPENDFSYNC = ("always", "everysec", "no")


def redis_server() -> str:
    path = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not Path(path).exists():
        raise ServiceError("redis-server is not installed (Debian package redis-server; `make setup` installs it)")
    return path


class Redis(Service):
    """redis-server on host:port with an append-only file in `workdir/data`."""

    kind = "redis"
    user = "redis"
    start_timeout = 30.0

    def __init__(
        self, host: Host, port: int, workdir: str | Path, *, appendfsync: str = "everysec", name: str | None = None
    ):
        if appendfsync not in APPENDFSYNC:
            raise ValueError(f"appendfsync: expected one of {', '.join(APPENDFSYNC)}, got {appendfsync!r}")
        super().__init__(host, port, workdir, name)
        self.appendfsync = appendfsync

    @property
    def data_dir(self) -> Path:
        return self.workdir / "data"

    @property
    def conf_path(self) -> Path:
        return self.workdir / "redis.conf"

    @property
    def log_file(self) -> Path:
        return self.workdir / "redis.log"

    @property
    def url(self) -> str:
        return f"redis://{self.host.address}:{self.port}/0"

    def conf(self) -> str:
        opts = {
            "bind": self.host.address,
            "port": str(self.port),
            "protected-mode": "no",
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
        self.conf_path.write_text(self.conf())
        give_to(self.user, self.workdir)

    def command(self) -> list[str]:
        return run_as(self.user, [redis_server(), str(self.conf_path)])

    def healthy(self) -> bool:
        try:
            with socket.create_connection((self.host.address, self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def logs(self) -> dict[str, Path]:
        out = super().logs()
        if self.log_file.exists():
            out["log"] = self.log_file
        return out
