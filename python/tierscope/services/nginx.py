"""nginx: the web tier. Serves static files, proxies the rest to application servers, and writes
an access log carrying the times the fine-grained analysis needs.

Access log format `tierscope` (one line per request, space separated, see docs/importers.md):

    $remote_addr $msec $request_time $upstream_response_time $request_id $status
    $body_bytes_sent $request_length $connection $connection_requests "$request"

`$msec` is the time the response was finished (seconds with ms resolution); the request arrived
at `$msec - $request_time`.

In a root lab the master runs as root (it binds, opens the logs and writes the pid file) and the
workers, which serve the requests, as the lab's unprivileged system user (`user` directive,
`services._accounts.LAB_OS_USER`); the temp directories nginx makes are theirs, and the work
directory, the document root and their ancestors are made searchable for them (o+x).
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

from tierscope.services._accounts import AccountError, group_name, lab_account, make_traversable
from tierscope.services.base import Service, ServiceError
from tierscope.testbed.host import Host

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"

LOG_FORMAT = (
    "$remote_addr $msec $request_time $upstream_response_time $request_id $status "
    '$body_bytes_sent $request_length $connection $connection_requests "$request"'
)

#: the path nginx answers itself for health checks (not written to the access log)
HEALTH_PATH = "/__tierscope_health"


class Nginx(Service):
    """nginx in the foreground with its own config, pid file, logs and temp dirs under workdir."""

    kind = "nginx"
    stop_signal = signal.SIGQUIT  # graceful: finish in-flight requests
    start_timeout = 20.0

    def __init__(
        self,
        host: Host,
        port: int,
        workdir: str | Path,
        *,
        root: str | Path | None = None,
        upstreams: list[str] | None = None,
        balance: str = "round_robin",
        upstream_keepalive: int = 64,
        workers: int = 1,
        worker_connections: int = 4096,
        keepalive_requests: int = 100000,
        locations: str = "",
        access_log: bool = True,
        name: str | None = None,
    ):
        super().__init__(host, port, workdir, name)
        if balance not in ("round_robin", "least_conn"):
            raise ValueError(f"nginx balance: expected round_robin or least_conn, got {balance!r}")
        self.root = Path(root).absolute() if root else None
        self.upstreams = list(upstreams or [])
        self.balance = balance
        self.upstream_keepalive = upstream_keepalive
        self.workers = workers
        self.worker_connections = worker_connections
        self.keepalive_requests = keepalive_requests
        self.locations = locations
        self.access_log_enabled = access_log

    @property
    def conf_path(self) -> Path:
        return self.workdir / "nginx.conf"

    @property
    def access_log(self) -> Path:
        return self.workdir / "access.log"

    @property
    def error_log(self) -> Path:
        return self.workdir / "error.log"

    @property
    def url(self) -> str:
        return f"http://{self.host.address}:{self.port}"

    def config(self) -> str:
        """The nginx.conf text for these parameters."""
        w = self.workdir
        user = ""
        if os.geteuid() == 0:  # workers as the unprivileged lab user, never root
            acct = self.worker_account()
            user = f"user {acct.pw_name} {group_name(acct)};\n"
        access = f"access_log {self.access_log} tierscope;" if self.access_log_enabled else "access_log off;"
        upstream = ""
        fallback = "return 404;"
        if self.upstreams:
            servers = "\n".join(f"        server {u};" for u in self.upstreams)
            method = "        least_conn;\n" if self.balance == "least_conn" else ""
            upstream = (
                f"    upstream app_tier {{\n{method}{servers}\n        keepalive {self.upstream_keepalive};\n    }}\n"
            )
            fallback = (
                "proxy_pass http://app_tier;\n"
                "            proxy_http_version 1.1;\n"
                '            proxy_set_header Connection "";\n'
                "            proxy_set_header Host $host;\n"
                "            proxy_set_header X-Request-Id $request_id;"
            )
        root = f"root {self.root};" if self.root else f"root {w}/empty;"
        static = "try_files $uri @app;" if self.root else ("try_files /nonexistent @app;")
        return f"""# written by tierscope; do not edit
{user}worker_processes {self.workers};
daemon off;
pid {w}/nginx.pid;
error_log {self.error_log} warn;
events {{ worker_connections {self.worker_connections}; }}
http {{
    log_format tierscope '{LOG_FORMAT}';
    {access}
    client_body_temp_path {w}/tmp/body;
    proxy_temp_path {w}/tmp/proxy;
    fastcgi_temp_path {w}/tmp/fastcgi;
    uwsgi_temp_path {w}/tmp/uwsgi;
    scgi_temp_path {w}/tmp/scgi;
    default_type application/octet-stream;
    types {{ text/html html htm; text/css css; image/gif gif; image/png png; image/jpeg jpg;
             application/javascript js; text/plain txt; }}
    sendfile on;
    tcp_nodelay on;
    keepalive_timeout 65;
    keepalive_requests {self.keepalive_requests};
    add_header X-Request-Id $request_id always;
{upstream}    server {{
        listen {self.host.address}:{self.port} reuseport backlog=4096;
        {root}
        location = {HEALTH_PATH} {{ access_log off; return 200 "ok\\n"; }}
{self.locations}
        location / {{ {static} }}
        location @app {{
            {fallback}
        }}
    }}
}}
"""

    def worker_account(self):
        """The account the workers run as (root labs): the lab's system user."""
        try:
            return lab_account()
        except AccountError as err:
            raise ServiceError(f"{self.name}: {err}") from None

    def prepare(self) -> None:
        for d in ("tmp", "empty"):
            (self.workdir / d).mkdir(parents=True, exist_ok=True)
        self.conf_path.write_text(self.config())
        if os.geteuid() == 0:  # the workers reach their temp directories and the static files
            make_traversable(self.workdir / "tmp" / "body")
            make_traversable(self.workdir / "empty" / "x")
            if self.root and self.root.is_dir():
                make_traversable(self.root / "x")

    def command(self) -> list[str]:
        return [NGINX, "-p", str(self.workdir), "-c", str(self.conf_path)]

    def check_config(self) -> None:
        """Run `nginx -t` on the written config; raise ServiceError with nginx's message."""
        import subprocess

        self.workdir.mkdir(parents=True, exist_ok=True)
        self.prepare()
        out = subprocess.run(
            [NGINX, "-t", "-p", str(self.workdir), "-c", str(self.conf_path)],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            raise ServiceError(f"{self.name}: invalid config {self.conf_path}:\n{out.stderr}")

    def healthy(self) -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(self.url + HEALTH_PATH, timeout=0.5) as r:
                return r.status == 200
        except OSError:
            return False

    def logs(self) -> dict[str, Path]:
        out = super().logs()
        for name, p in (("access", self.access_log), ("error", self.error_log)):
            if p.exists():
                out[name] = p
        return out

    def access_log_lines(self) -> list[str]:
        """The access log's lines (empty when none)."""
        if not self.access_log.exists():
            return []
        return self.access_log.read_text().splitlines()
