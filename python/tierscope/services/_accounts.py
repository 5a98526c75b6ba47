"""Running a server as an unprivileged OS user from a root lab: the database servers as their own
(postgres, mysql, redis), nginx's workers and the app servers as the lab's system user
`LAB_OS_USER` (made by `make setup`, or here on first use: `lab_account`). And what the database
servers (`Postgres`, `MariaDB`) share of their accounts: `DatabaseServer`, a server run as its own
OS user that holds the lab's user and password and reaches the lab's database."""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, TypedDict

from tierscope.contracts.dbms import DbConfig
from tierscope.services.base import Service
from tierscope.services.credentials import Credentials, lab_credentials
from tierscope.testbed.host import Host

#: the unprivileged system user nginx's workers and the app servers run as in a root lab
LAB_OS_USER = "tierscope"
#: login shells that are no login shell
_NO_LOGIN = ("/usr/sbin/nologin", "/sbin/nologin", "/bin/false", "/usr/bin/false")


def account(user: str) -> pwd.struct_passwd | None:
    """The OS account, or None when it does not exist."""
    try:
        return pwd.getpwnam(user)
    except KeyError:
        return None


class AccountError(RuntimeError):
    """The lab's system user is missing and cannot be made, or is not fit to run servers as."""


def lab_account(user: str = LAB_OS_USER) -> pwd.struct_passwd:
    """The system user nginx's workers and the app servers run as (root labs only).

    `make setup` makes it; when it is missing (a host that never ran `make setup`, such as a remote
    run's hosts) it is made now the same way: a system user with a group of its own, no home and no
    login shell (`useradd --system`). An account of that name that could log in, or is uid 0, is
    refused: the servers would run as a person, or as root."""
    acct = account(user)
    if acct is None:
        if os.geteuid() != 0:
            raise AccountError(f"the system user {user!r} does not exist; run `make setup` as root to make it")
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"
        done = subprocess.run(
            [useradd, "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent"]
            + ["--shell", next((s for s in _NO_LOGIN if os.path.exists(s)), "/bin/false"), user],
            capture_output=True,
            text=True,
        )
        acct = account(user)  # also when another process made it first (useradd exits 9)
        if acct is None:
            raise AccountError(
                f"the system user {user!r} does not exist and `useradd` failed ({done.stderr.strip()}); "
                "run `make setup` as root to make it"
            )
        print(
            f"tierscope: made the system user {user!r} (uid {acct.pw_uid}) that nginx's workers and the "
            "app servers run as (`make setup` makes it too)",
            file=sys.stderr,
        )
    if acct.pw_uid == 0 or acct.pw_gid == 0:
        raise AccountError(f"the system user {user!r} has uid {acct.pw_uid} gid {acct.pw_gid}: it must not be root")
    if acct.pw_shell not in _NO_LOGIN:
        raise AccountError(
            f"the account {user!r} has the login shell {acct.pw_shell}: tierscope runs its servers as a system "
            f"user without one (`usermod -s /usr/sbin/nologin {user}`, or remove it and run `make setup`)"
        )
    return acct


def group_name(acct: pwd.struct_passwd) -> str:
    """The name of the account's primary group."""
    return grp.getgrgid(acct.pw_gid).gr_name


def run_as(user: str, argv: list[str]) -> list[str]:
    """`argv` run as `user` when we are root (setpriv execs, so the pid stays the server's)."""
    if os.geteuid() != 0:
        return argv
    return ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--", *argv]


def make_traversable(path: Path) -> None:
    """Give every ancestor of `path` search permission for others (o+x, not read: names must be
    known), so a server running as another user reaches `path` even under a private directory."""
    parent = path.absolute().parent
    while True:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            os.chmod(parent, mode | stat.S_IXOTH)
        if parent == parent.parent:
            break
        parent = parent.parent


def give_to(user: str, path: Path) -> None:
    """Make `path` (recursively) owned by `user`, and its ancestors traversable (o+x) so the
    server can reach it even under a private temp directory. No-op when not root."""
    if os.geteuid() != 0:
        return
    acct = account(user)
    if acct is None:
        raise RuntimeError(f"OS user {user!r} does not exist (is its Debian package installed?)")
    for root, dirs, files in os.walk(path):
        os.chown(root, acct.pw_uid, acct.pw_gid)
        for name in dirs + files:
            os.lchown(os.path.join(root, name), acct.pw_uid, acct.pw_gid)
    make_traversable(path)


def open_the_way(acct: pwd.struct_passwd, paths: list[Path], role: str) -> None:
    """Make every path of `paths` reachable by `acct` (o+x on the ancestors closed to it, e.g. a
    checkout under /root), or raise AccountError naming the first one it still cannot read."""
    for path in paths:
        # the path and, when it is a link, where it leads (a venv's python -> pyenv's under /root)
        for way in dict.fromkeys((path, path.resolve())):
            if blocked_for(acct, way) is not None:
                make_traversable(way)
        blocked = blocked_for(acct, path)
        if blocked is not None:
            raise AccountError(
                f"{role} runs as the unprivileged user {acct.pw_name!r}, which cannot reach {path} ({blocked} is "
                "closed to it); install tierscope where other users can read it (e.g. not under /root)"
            )


def blocked_for(acct: pwd.struct_passwd, path: Path) -> Path | None:
    """The first directory on the way to `path` (or `path` itself) that `acct` may not search
    (or, for `path`, read): None when the account can read `path`."""
    groups = {acct.pw_gid} | {g.gr_gid for g in grp.getgrall() if acct.pw_name in g.gr_mem}

    def allowed(p: Path, bits: tuple[int, int, int]) -> bool:
        st = p.stat()
        if st.st_uid == acct.pw_uid:
            return bool(st.st_mode & bits[0])
        if st.st_gid in groups:
            return bool(st.st_mode & bits[1])
        return bool(st.st_mode & bits[2])

    path = Path(path).resolve()
    for p in reversed(path.parents):
        if not allowed(p, (stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH)):
            return p
    return None if allowed(path, (stat.S_IRUSR, stat.S_IRGRP, stat.S_IROTH)) else path


class ServerOptions(TypedDict, total=False):
    """The options every `DatabaseServer` takes (see it), by keyword."""

    max_connections: int
    settings: dict[str, str] | None
    name: str | None
    credentials: Credentials | None
    database: str | None


class DatabaseServer(Service):
    """A database server the lab starts, run as its own OS user (`user`), its data under
    `<workdir>/data`: `credentials` are the lab's user and password on it (default: the lab's file
    above the workdir, `lab_credentials`), `database` the lab's database there (made once it
    answers, the lab user's), `max_connections` and `settings` (name -> value, over its defaults)
    its configuration, and `db_config` what a client uses to reach one of its databases. A
    subclass names its client (`dbms`, a `DbConfig` DBMS) and adds its own settings."""

    #: the client DBMS of `DbConfig` ("postgresql", "mariadb")
    dbms = ""

    def __init__(
        self,
        host: Host,
        port: int,
        workdir: str | Path,
        *,
        max_connections: int = 200,
        settings: dict[str, str] | None = None,
        name: str | None = None,
        credentials: Credentials | None = None,
        database: str | None = None,
    ):
        super().__init__(host, port, workdir, name)
        self.max_connections = max_connections
        self.settings = dict(settings or {})
        self._credentials = credentials
        self.database = database

    @property
    def credentials(self) -> Credentials:
        """The lab's user and password (default: the lab's file above the workdir, `lab_credentials`)."""
        if self._credentials is None:
            self._credentials = lab_credentials(self.workdir.parent)
        return self._credentials

    @property
    def data_dir(self) -> Path:
        return self.workdir / "data"

    def db_config(self, database: str, **kwargs: Any) -> DbConfig:
        """What an app (or a loader) uses to reach `database` here: the lab user and password over TCP."""
        c = self.credentials
        return DbConfig(
            self.dbms,
            host=self.host.address,
            port=self.port,
            user=c.user,
            password=c.password,
            database=database,
            **kwargs,
        )

    #: the statement counting the busy client sessions (`BusySessions`), minus the probe's own
    busy_sessions_sql = ""
    #: the statement giving how many client sessions the server admits (its connection limit
    #: less the slots it keeps for its administrators)
    client_sessions_sql = ""

    def admin_connection(self) -> Any:
        """A DB-API connection as the server's administrator over its socket (autocommit)."""
        raise NotImplementedError

    def busy_sessions_probe(self) -> BusySessions:
        """A probe of the sessions busy here now, on one administrator connection kept open."""
        return BusySessions(self.admin_connection(), self.busy_sessions_sql, self.client_sessions_sql)


class BusySessions:
    """How many client sessions a database server is busy with: inside a statement or inside an
    open transaction (a pooled connection the app holds between the statements of a transaction
    is busy; one back in the pool is not). The database's own view of its connections, where a
    count of established sockets (`sockets_util`) says only how many the pools ever opened. One
    connection, kept open (no authentication per sample), an administrator's (it takes none of
    the clients' slots); `close()` when done."""

    def __init__(self, connection: Any, sql: str, limit_sql: str):
        self.connection = connection
        self.sql = sql
        with connection.cursor() as cur:
            cur.execute(limit_sql)
            #: the client sessions the server admits: what `busy` is a share of
            self.limit = int(cur.fetchone()[0])

    def busy(self) -> int:
        with self.connection.cursor() as cur:
            cur.execute(self.sql)
            return int(cur.fetchone()[0])

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.connection.close()
