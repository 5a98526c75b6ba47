"""The clustering middleware tier (C-JDBC-like RAIDb-1, `tierscope-engine middleware`, the Rust
engine's subcommand; docs/middleware.md) as a `Service`: one process on host:port in front of the
database servers `backends` ("addr:port", in LPRF order), with `pool` connections to each, read
policy `policy` (one of `POLICIES`; "wrr" with `weights`) and write completion `wait` ("first" |
"all"). The counts it writes on exit are `stats()`. It keeps a recovery log in its work directory
(`recovery_log_path`).

`dbms` is the backends' DBMS as `DbConfig` names it: "postgresql" (the PostgreSQL protocol on both
sides) or "mariadb" (the MySQL protocol on both sides). Either way the middleware logs in to the
backends as `user`/`password` (scram-sha-256 / mysql_native_password) and asks its clients for the
same credentials (scram-sha-256 / mysql_native_password): by default the lab's
(`tierscope.services.credentials`, the file above the workdir). The password reaches the process
in its environment (`PASSWORD_ENV`), not on its command line.

In a root lab the middleware runs as the lab's unprivileged system user, as the app servers do
(`services._accounts.LAB_OS_USER` through `setpriv`, which execs, so the pid stays the server's):
its work directory (console log, stats) is given to that user and closed to everyone else (0700),
the way to its program is made searchable (o+x), and the password stays in its environment, which
only that user and root can read in /proc. It needs nothing else: no file of the lab's credentials.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tierscope.contracts.dbms import DbConfig
from tierscope.contracts.dbms import dbms as dbms_of

# the middleware's contract (contracts/middleware.json, held to the engine by cargo test)
from tierscope.contracts.middleware import (
    DEFAULTS,
    PASSWORD_ENV,
    POLICIES,
    PROTOCOLS,
    SCHEDULERS,
    WAITS,
    WEIGHTED_POLICIES,
)
from tierscope.engine import engine_path
from tierscope.services._accounts import AccountError, give_to, lab_account, make_traversable, open_the_way, run_as
from tierscope.services.base import Service, ServiceError
from tierscope.services.credentials import lab_credentials
from tierscope.testbed.host import Host


def engine_middleware() -> list[str]:
    """The middleware's program: `tierscope-engine middleware` (EngineNotFound when not built)."""

    return [str(engine_path()), "middleware"]


class Middleware(Service):
    """The RAIDb-1 middleware process, speaking the PostgreSQL or the MySQL protocol (`dbms`)."""

    kind = "middleware"
    start_timeout = 30.0

    def __init__(
        self,
        host: Host,
        port: int,
        workdir: str | Path,
        *,
        backends: list[str],
        database: str = "rubbos",
        user: str | None = None,
        password: str | None = None,
        dbms: str = "postgresql",
        pool: int = DEFAULTS["pool"],
        policy: str = DEFAULTS["policy"],
        wait: str = DEFAULTS["wait"],
        weights: list[float] | None = None,
        labels: bool = False,
        scheduler: str = DEFAULTS["scheduler"],
        name: str | None = None,
    ):
        super().__init__(host, port, workdir, name)
        if not backends:
            raise ValueError("middleware backends: expected at least one database server address")
        if policy not in POLICIES:
            raise ValueError(f"middleware policy: expected one of {', '.join(POLICIES)}, got {policy!r}")
        if weights is not None and policy not in WEIGHTED_POLICIES:
            raise ValueError(
                f"middleware weights: only with policy {' or '.join(sorted(WEIGHTED_POLICIES))}, got {policy!r}"
            )
        if weights is not None and (
            len(weights) != len(backends) or any(w < 0 for w in weights) or not any(w > 0 for w in weights)
        ):
            raise ValueError(
                f"middleware weights: expected {len(backends)} weights >= 0 (one per database "
                f"server), one of them > 0, got {weights}"
            )
        if wait not in WAITS:
            raise ValueError(f"middleware wait: expected {' or '.join(WAITS)}, got {wait!r}")
        if scheduler not in SCHEDULERS:
            raise ValueError(f"middleware scheduler: expected {' or '.join(SCHEDULERS)}, got {scheduler!r}")
        if int(pool) < 1:
            raise ValueError(f"middleware pool: expected >= 1, got {pool}")
        try:
            protocol = dbms_of(dbms).protocol
        except ValueError as err:
            raise ValueError(f"middleware {err}") from None
        if protocol not in PROTOCOLS:
            raise ValueError(f"middleware dbms: {dbms} speaks {protocol}, the middleware {' and '.join(PROTOCOLS)}")
        self.backends = list(backends)
        self.database = database
        if user is None or password is None:
            lab = lab_credentials(self.workdir.parent)
            user = lab.user if user is None else user
            password = lab.password if password is None else password
        self.user = user
        self.password = password
        self.dbms = dbms_of(dbms).data  # the backends' client: Galera's is MariaDB's
        self.protocol = protocol
        self.pool = int(pool)
        self.policy = policy
        self.wait = wait
        self.weights = list(weights) if weights is not None else None
        self.labels = bool(labels)
        self.scheduler = scheduler

    @property
    def stats_path(self) -> Path:
        return self.workdir / "middleware.stats.json"

    @property
    def recovery_log_path(self) -> Path:
        """The middleware's recovery log (`--recovery-log`, docs/middleware.md: replicas that cannot
        drift), in its work directory, with either protocol."""
        return self.workdir / "middleware.recovery.log"

    def db_config(self, base: DbConfig | None = None) -> DbConfig:
        """The app's database configuration pointing at this middleware (its protocol's driver, the
        same user and password as the backends)."""
        from dataclasses import replace

        dbms = "mariadb" if self.protocol == "mysql" else "postgresql"
        base = base or DbConfig(dbms, user=self.user, password=self.password, database=self.database)
        return replace(base, dbms=dbms, host=self.host.address, port=self.port, user=self.user, password=self.password)

    def dsn(self) -> str:
        """A libpq connection string to this (PostgreSQL-protocol) middleware, the password included."""
        import psycopg

        return psycopg.conninfo.make_conninfo(
            host=self.host.address, port=self.port, user=self.user, password=self.password, dbname=self.database
        )

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.password:
            env[PASSWORD_ENV] = self.password
        return env

    def prepare(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.stats_path.unlink(missing_ok=True)
        if os.geteuid() == 0:
            acct = self.run_account()
            try:
                open_the_way(acct, self._code_paths(), "the middleware")
            except AccountError as err:
                raise ServiceError(f"{self.name}: {err}") from None
            give_to(acct.pw_name, self.workdir)  # where it writes its stats on exit
            os.chmod(self.workdir, 0o700)  # its console and stats: that user's and root's only

    def stop(self, timeout: float = 20.0) -> None:
        if os.geteuid() == 0 and self.running():
            # it writes its stats on exit, by path: open the way again in case an ancestor was closed
            # during the run (pytest closes its pytest-of-<user> directory when a session starts)
            make_traversable(self.workdir)
        super().stop(timeout)

    def run_account(self):
        """The account the middleware runs as in a root lab: the lab's system user."""
        try:
            return lab_account()
        except AccountError as err:
            raise ServiceError(f"{self.name}: {err}") from None

    def _code_paths(self) -> list[Path]:
        """What the unprivileged user must read to run the middleware: its program."""
        return [Path(engine_middleware()[0])]

    def command(self) -> list[str]:
        argv = [
            *engine_middleware(),
            "--listen",
            self.address,
            "--db",
            self.database,
            "--user",
            self.user,
            "--pool",
            str(self.pool),
            "--policy",
            self.policy,
            "--wait",
            self.wait,
            "--stats",
            str(self.stats_path),
        ]
        if self.protocol != "postgres":
            argv += ["--protocol", self.protocol]
        for b in self.backends:
            argv += ["--backend", b]
        if self.weights is not None:
            argv += ["--weights", ",".join(f"{w:g}" for w in self.weights)]
        if self.labels:
            argv.append("--labels")
        if self.scheduler != DEFAULTS["scheduler"]:
            argv += ["--scheduler", self.scheduler]
        argv += ["--recovery-log", str(self.recovery_log_path)]
        return run_as(self.run_account().pw_name, argv) if os.geteuid() == 0 else argv

    def stats(self) -> dict:
        """The counts the middleware wrote when it stopped (reads per backend, writes, disabled)."""
        if not self.stats_path.exists():
            raise ServiceError(f"{self.name}: no stats at {self.stats_path} (has it been stopped?)")
        return json.loads(self.stats_path.read_text())
