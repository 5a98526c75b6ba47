"""State tierscope can trust: its own directories, files written atomically, processes it started.

A state file says which processes to signal and which files to write, so it must come from
tierscope, not from another user who got there first (``/tmp/tierscope-rubbos`` made by anyone,
a planted ``state.json`` naming a root process, a symlink to a root-owned file):

- `default_dir`: ``/run/tierscope/<name>`` as root; otherwise ``$XDG_RUNTIME_DIR/tierscope/<name>``
  (a per-user tmpfs), else ``~/.local/state/tierscope/<name>``;
- `secure_dir`: a directory is created 0700, and an existing one is refused when it is a symbolic
  link, owned by another user, or writable by group or others (the error names it, its owner and
  mode);
- `write_json` writes a temporary file in the same directory (``O_EXCL|O_NOFOLLOW``, 0600), fsyncs
  it and renames it over the state file; `read_json` opens with ``O_NOFOLLOW`` and refuses a file
  that is not a regular file owned by this user and private to it;
- `identity` / `same_process`: a process is its pid *and* its start time (field 22 of
  ``/proc/<pid>/stat``) and command line, so a recorded pid that now names another process (the
  one recorded exited and the pid was reused, or the record was planted) is never signalled.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import stat
from pathlib import Path
from typing import Any

ROOT_DIR = Path("/run/tierscope")


class StateError(RuntimeError):
    """A state directory or file tierscope will not trust; the message names it and why."""


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def default_dir(name: str) -> Path:
    """Where tierscope keeps the run state `name` (``rubbos``, ``testbed``) of this user."""
    if os.geteuid() == 0:
        return ROOT_DIR / name
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_absolute():
        try:
            st = os.stat(runtime)
            if st.st_uid == os.geteuid() and not st.st_mode & 0o077:
                return Path(runtime) / "tierscope" / name
        except OSError:
            pass
    return Path.home() / ".local" / "state" / "tierscope" / name


def check_dir(path: Path) -> None:
    """Refuse a directory that is a symbolic link, owned by another user or writable by others."""
    st = os.lstat(path)
    me = os.geteuid()
    why = None
    if stat.S_ISLNK(st.st_mode):
        why = f"it is a symbolic link (to {os.readlink(path)})"
    elif not stat.S_ISDIR(st.st_mode):
        why = "it is not a directory"
    elif st.st_uid != me:
        why = f"it is owned by {_user(st.st_uid)}, not by you ({_user(me)})"
    elif st.st_mode & 0o022:
        why = "group or others can write to it"
    if why:
        raise StateError(
            f"refusing state directory {path}: {why} (owner {_user(st.st_uid)}, mode "
            f"{stat.filemode(st.st_mode)} {stat.S_IMODE(st.st_mode):04o}); tierscope keeps state only in a "
            "directory of yours that no one else can write (remove it, or choose another)"
        )


def secure_dir(path: str | Path) -> Path:
    """`path` as a state directory: created with mode 0700 (missing parents too), or checked."""
    path = Path(path).absolute()
    missing = []
    p = path
    while not os.path.lexists(p):
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made by someone else in between: checked below
            os.mkdir(d, 0o700)
    check_dir(path)
    return path


def check_file(path: Path, fd: int) -> None:
    st = os.fstat(fd)
    me = os.geteuid()
    why = None
    if not stat.S_ISREG(st.st_mode):
        why = "it is not a regular file"
    elif st.st_uid != me:
        why = f"it is owned by {_user(st.st_uid)}, not by you ({_user(me)})"
    elif st.st_mode & 0o022:
        why = "group or others can write to it"
    if why:
        raise StateError(
            f"refusing state file {path}: {why} (mode {stat.filemode(st.st_mode)}); it was not written by "
            "tierscope as you"
        )


def read_json(path: str | Path) -> dict | None:
    """The state file at `path` (None when there is none), checked as `check_file` says; the
    directory is checked first."""
    path = Path(path)
    check_dir(path.parent)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as err:
        if os.path.islink(path):
            raise StateError(f"refusing state file {path}: it is a symbolic link (to {os.readlink(path)})") from None
        raise StateError(f"cannot read state file {path}: {err.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        check_file(path, fd)
        try:
            data = json.loads(f.read())
        except ValueError as err:
            raise StateError(f"state file {path} is not JSON ({err})") from None
    if not isinstance(data, dict):
        raise StateError(f"state file {path}: expected a JSON object, got {type(data).__name__}")
    return data


def check_writable(path: str | Path) -> None:
    """Refuse before starting anything when the state file at `path` could not be written safely:
    its directory untrusted, or the file itself a symbolic link or not ours."""
    path = Path(path)
    check_dir(path.parent)
    if os.path.islink(path):
        raise StateError(f"refusing state file {path}: it is a symbolic link (to {os.readlink(path)})")
    if path.exists():
        read_json(path)


def write_json(path: str | Path, data: Any) -> Path:
    """Write `data` as JSON to `path` atomically: a private temporary file in the same (checked)
    directory, fsynced, renamed over `path` (a symbolic link at `path` is refused, never followed)."""
    path = Path(path)
    check_dir(path.parent)
    if os.path.islink(path):
        raise StateError(f"refusing state file {path}: it is a symbolic link (to {os.readlink(path)})")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(json.dumps(data, indent=1).encode())
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return path


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat: when the process started, in clock ticks after boot (None:
    no such process, or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] == b"Z":
        return None
    return int(fields[19])  # fields after the command: state is field 3, starttime field 22


def cmdline(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0")[:-1]] if raw else []


def identity(pid: int | None) -> dict | None:
    """{"pid", "start_time", "cmdline"} of a live process (None when there is none)."""
    if not pid or pid <= 0:
        return None
    start = start_time(pid)
    cmd = cmdline(pid)
    if start is None or cmd is None:
        return None
    return {"pid": pid, "start_time": start, "cmdline": cmd}


def same_process(record: dict) -> tuple[bool, str]:
    """Whether the process `record` describes ({"pid", "start_time", "cmdline"}) is still the one
    running under that pid, and if not, why (for the message)."""
    pid = record.get("pid")
    if not isinstance(pid, int) or pid <= 1:
        return False, f"pid {pid!r} is not a process tierscope could have started"
    now = identity(pid)
    if now is None:
        return False, f"pid {pid} is not running"
    if "start_time" not in record or "cmdline" not in record:
        return False, f"pid {pid}: the record has no start time and command line to check it against"
    if now["start_time"] != record["start_time"]:
        return False, f"pid {pid} started at tick {now['start_time']}, not {record['start_time']} as recorded"
    if now["cmdline"] != record["cmdline"]:
        return False, f"pid {pid} runs {' '.join(now['cmdline'])[:80]!r}, not the command recorded"
    return True, ""
