"""Running a server as its own unprivileged OS user (postgres, mysql) from a root lab."""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path


def account(user: str) -> pwd.struct_passwd | None:
    """The OS account, or None when it does not exist."""
    try:
        return pwd.getpwnam(user)
    except KeyError:
        return None


def run_as(user: str, argv: list[str]) -> list[str]:
    """`argv` run as `user` when we are root (setpriv execs, so the pid stays the server's)."""
    if os.geteuid() != 0:
        return argv
    return ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--", *argv]


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
    parent = path.absolute().parent
    while True:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            os.chmod(parent, mode | stat.S_IXOTH)
        if parent == parent.parent:
            break
        parent = parent.parent
