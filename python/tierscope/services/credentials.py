"""The lab's credentials: one database user (`LAB_USER`) and a random password per lab or run,
kept in a file only its owner (root, in a root lab) can read.

Every database server the lab starts requires them: PostgreSQL over TCP (scram-sha-256), MariaDB
and Galera (mysql_native_password; root logs in by unix_socket only), and the clustering
middleware, which asks its clients for the same user and password and logs in to its backends with
them. The servers of one lab share one file, `credentials.json` in the directory above their
working directories (a run point's directory, `tierscope rubbos up`'s run directory, a test's
temporary directory): `lab_credentials(directory)` reads it, or makes it the first time
(`secrets.token_urlsafe`, mode 0600, written to a temporary file and linked into place, so a
reader never sees half a file and a planted file or symlink is never used).

The password reaches the programs that need it through their environment (`PGPASSWORD`, the app
servers' `<APP>_DB_PASSWORD`, the middleware's `TIERSCOPE_MIDDLEWARE_PASSWORD`), never through a
command line another user could read in /proc.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tierscope.contracts.dbms import LAB_USER

#: the file, in a lab's or run's directory, holding its credentials
FILE_NAME = "credentials.json"


class CredentialsError(RuntimeError):
    """A credentials file that cannot be trusted or read."""


@dataclass(frozen=True)
class Credentials:
    """A database user and its password; `path`: the file they were read from (None: made in memory)."""

    user: str
    password: str
    path: Path | None = None

    def env(self) -> dict[str, str]:
        """libpq's environment for them (pgbench, psql): PGUSER and PGPASSWORD."""
        return {"PGUSER": self.user, "PGPASSWORD": self.password}

    def __repr__(self) -> str:  # never print the password
        return f"Credentials(user={self.user!r}, path={str(self.path) if self.path else None!r})"


def new_password() -> str:
    """A fresh random password (32 bytes of randomness, URL-safe text: no quote, space or backslash)."""
    return secrets.token_urlsafe(32)


def _read(path: Path) -> Credentials | None:
    """The credentials in `path` when it is a regular file of ours that no one else can read or
    write; None when there is none; CredentialsError when there is one that cannot be trusted."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as err:  # ELOOP: a symlink
        raise CredentialsError(f"{path}: not a regular file ({err.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise CredentialsError(
                f"{path}: expected a regular file owned by uid {os.geteuid()} with mode 0600, found "
                f"uid {st.st_uid} mode {stat.S_IMODE(st.st_mode):04o}"
            )
        with os.fdopen(fd, "r", closefd=False) as f:
            data = json.loads(f.read())
        return Credentials(str(data["user"]), str(data["password"]), path)
    except (ValueError, KeyError, TypeError) as err:
        raise CredentialsError(f"{path}: not a credentials file ({err})") from None
    finally:
        os.close(fd)


def lab_credentials(directory: str | Path, user: str = LAB_USER) -> Credentials:
    """The credentials of the lab whose servers work under `directory`: read from
    `directory/credentials.json`, or made there now (random password, mode 0600).

    A file there that is not ours or that others can read is replaced by a new one (it may have
    been planted to learn or choose the password)."""
    directory = Path(directory).absolute()
    directory.mkdir(parents=True, exist_ok=True)
    if os.stat(directory).st_mode & 0o002:
        raise CredentialsError(
            f"{directory}: writable by every user, no place for a lab's credentials (give the servers "
            "work directories inside a directory of their own)"
        )
    path = directory / FILE_NAME
    try:
        found = _read(path)
    except CredentialsError:
        path.unlink()
        found = None
    if found is not None:
        return found
    _write(path, user, new_password(), replace=False)
    found = _read(path)
    if found is None:
        raise CredentialsError(f"{path}: vanished while it was being made")
    return found


def _write(path: Path, user: str, password: str, replace: bool) -> None:
    """Write the credentials file `path` (mode 0600) through a temporary file in its directory:
    linked into place when there is none (`replace` False: an existing one wins), renamed over it
    with `replace`. Neither follows a symlink at `path`."""
    body = json.dumps({"user": user, "password": password, "created_at": time.time()}, indent=1) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=".credentials-", dir=path.parent)  # mode 0600, O_EXCL
    try:
        with os.fdopen(fd, "w") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.rename(tmp, path)
            return
        with contextlib.suppress(FileExistsError):  # another process of the lab made it first: use theirs
            os.link(tmp, path)  # atomic, and never over an existing file or through a symlink
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def save_credentials(directory: str | Path, credentials: Credentials) -> Credentials:
    """Make `credentials` the lab's in `directory` (the file `lab_credentials` reads): how the
    hosts of a remote run share the one secret the controller made."""
    directory = Path(directory).absolute()
    directory.mkdir(parents=True, exist_ok=True)
    _write(directory / FILE_NAME, credentials.user, credentials.password, replace=True)
    return Credentials(credentials.user, credentials.password, directory / FILE_NAME)
