"""What every real server program the lab runs has in common.

A `Service` writes its configuration from parameters, starts its program in the foreground inside
a `Host` (loopback or a network namespace with cgroups), waits until it answers, stops it (also on
failure and Ctrl-C), and knows where its logs are. Subclasses say how: `prepare()` (config files,
data directory), `command()` (the foreground argv), `healthy()`, and optionally `stop_signal`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tierscope.procs import descendants, spawn, wait_gone
from tierscope.testbed.host import Host


class ServiceError(RuntimeError):
    """A service failed to start, answer or stop; the message carries the tail of its log."""


def tail(path: Path, lines: int = 20) -> str:
    """The last `lines` lines of a text file ('' when missing)."""
    try:
        data = path.read_bytes()[-16384:].decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def tcp_answers(address: str, port: int, timeout: float = 0.5) -> bool:
    """True when a TCP connection to address:port is accepted."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def free_port(address: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at `address` right now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


SOCKET_PATH_MAX = 107
"""Longest path a unix socket can be bound to on Linux (sun_path is 108 bytes with the NUL)."""


def socket_dir(workdir: Path, socket_name: str) -> Path:
    """Where a service puts its unix socket `socket_name`: `workdir/sock` when the socket's path
    fits in SOCKET_PATH_MAX bytes, else a short directory in the temporary directory named after
    a hash of `workdir` (deep run directories, e.g. pytest's, are longer than a socket can be).
    Remove it with `drop_socket_dir` once the program has stopped."""
    own = workdir / "sock"
    if len(os.fsencode(own / socket_name)) <= SOCKET_PATH_MAX:
        return own
    digest = hashlib.sha1(os.fsencode(workdir)).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / "tierscope-sock" / digest


def private_dir(path: Path, user: str | None = None) -> Path:
    """Make `path` a directory only its owner can enter (0700), owned by the OS user `user` when we
    are root: where a server puts its unix socket, so no other local user can reach the socket.
    A parent we made ourselves (the shared short directory of `socket_dir`) must not belong to
    anyone else or be writable by others: ServiceError if it does (it may have been planted)."""
    import stat

    # late: tierscope.services._accounts imports this module
    from tierscope.services._accounts import account

    acct = account(user) if os.geteuid() == 0 and user else None
    if os.geteuid() == 0 and user and acct is None:
        raise ServiceError(f"OS user {user!r} does not exist (is its Debian package installed?)")
    parent = path.parent
    if not parent.exists():
        parent.mkdir(parents=True, mode=0o755, exist_ok=True)
    st = os.lstat(parent)
    owners = {0, os.geteuid()} | ({acct.pw_uid} if acct else set())
    if st.st_uid not in owners or (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
        raise ServiceError(
            f"{parent}: owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):04o}; a socket "
            "directory's parent must be ours and not writable by others (remove it)"
        )
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        if path.is_symlink() or not path.is_dir():
            raise ServiceError(f"{path}: exists and is not a directory") from None
    if acct is not None:
        os.chown(path, acct.pw_uid, acct.pw_gid)
    os.chmod(path, 0o700)
    return path


def drop_socket_dir(path: Path, workdir: Path) -> None:
    """Remove a socket directory `socket_dir` put outside `workdir` (nothing left in /tmp)."""
    if workdir in path.parents:
        return
    import shutil

    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):
        path.parent.rmdir()  # the shared parent, when no other service uses it


def read_through(host: Host, files: list[Path], timeout: float = 600.0) -> int:
    """Read `files` from inside `host` (its namespace and cgroups), so the host's page cache holds
    what its memory limit allows of them, charged to the host, as on a server that has been running
    for a while; returns the bytes read. The reads pass the host's disk limits like any other."""
    files = [Path(p) for p in files]
    if not files:
        return 0
    total = sum(p.stat().st_size for p in files)
    argv = host.wrap(
        ["sh", "-c", 'for f in "$@"; do cat -- "$f"; done > /dev/null', "read-through", *[str(p) for p in files]]
    )
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout)
    if done.returncode != 0:
        raise ServiceError(
            f"{host.name}: reading {len(files)} files failed: {done.stderr.decode(errors='replace')[-300:]}"
        )
    return total


class Service:
    """A real server program started, checked and stopped by tierscope."""

    #: short program name, used for the default server name and log file names
    kind: str = "service"
    #: signal asking the program to shut down cleanly
    stop_signal: int = signal.SIGTERM
    #: seconds to wait for health after start
    start_timeout: float = 60.0

    def __init__(self, host: Host, port: int, workdir: str | Path, name: str | None = None):
        self.host = host
        self.port = int(port)
        self.workdir = Path(workdir).absolute()
        self.name = name or f"{self.kind}@{host.name}"
        self.proc: subprocess.Popen | None = None
        self._console: Path = self.workdir / f"{self.kind}.console.log"

    # --- what subclasses provide -------------------------------------------------------------
    def prepare(self) -> None:
        """Write configuration and create the data directory (idempotent)."""

    def command(self) -> list[str]:
        """The argv that runs the program in the foreground."""
        raise NotImplementedError

    def healthy(self) -> bool:
        """True when the program answers on its port."""
        return tcp_answers(self.host.address, self.port)

    def after_start(self) -> None:
        """Work to do once the program answers (create users, databases...)."""

    def logs(self) -> dict[str, Path]:
        """Log files by name (only those that exist)."""
        return {k: p for k, p in {"console": self._console}.items() if p.exists()}

    def env(self) -> dict[str, str] | None:
        return None

    # --- lifecycle ---------------------------------------------------------------------------
    @property
    def address(self) -> str:
        return f"{self.host.address}:{self.port}"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> Service:
        """Prepare, start in the foreground inside the host, and wait until healthy."""
        if self.running():
            return self
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.prepare()
        if tcp_answers(self.host.address, self.port, timeout=0.2):
            raise ServiceError(f"{self.name}: port {self.address} is already in use")
        with open(self._console, "ab") as console:
            self.proc = spawn(
                self.host.wrap(self.command()),
                stdout=console,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=self.env(),
            )
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServiceError(
                    f"{self.name}: exited with status {self.proc.returncode} while starting\n" + self._log_tail()
                )
            if self.healthy():
                try:
                    self.after_start()
                except Exception as err:
                    self.stop()
                    raise ServiceError(f"{self.name}: started but setup failed: {err}") from err
                return self
            time.sleep(0.05)
        self.stop()
        raise ServiceError(
            f"{self.name}: not healthy after {self.start_timeout:.0f} s on {self.address}\n" + self._log_tail()
        )

    def pids(self) -> list[int]:
        """The program's process and all its children (e.g. for SIGSTOP of a whole tier)."""
        if not self.running():
            return []
        return descendants(self.proc.pid)  # type: ignore[union-attr]

    def stop(self, timeout: float = 20.0) -> None:
        """Ask the program to stop, wait, then kill its whole process group if it lingers."""
        if self.proc is None:
            return
        tree = self.pids()
        if self.proc.poll() is None:
            for pid in tree:  # a paused (SIGSTOPped) tier must be able to hear us
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, self.stop_signal)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=timeout)
        # leftovers of the session (workers, forked helpers)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        for pid in wait_gone(tree, timeout=1.0):  # a child that left the session
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_gone(tree)  # stopped means gone from /proc, not only signalled
        self.proc = None

    def _log_tail(self) -> str:
        parts = []
        for name, path in self.logs().items():
            text = tail(path)
            if text:
                parts.append(f"--- {name} ({path}) ---\n{text}")
        return "\n".join(parts)

    def __enter__(self) -> Service:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running() else "stopped"
        return f"<{type(self).__name__} {self.name} {self.address} {state}>"
