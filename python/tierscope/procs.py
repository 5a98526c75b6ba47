"""Child processes that a Ctrl-C cannot orphan, and process trees that are really gone.

A SIGINT that lands while `subprocess.Popen` is creating a child raises KeyboardInterrupt after
the child exists but before its `Popen` object is returned: nobody holds the child any more, and
it outlives the run. `spawn` holds SIGINT back for the few milliseconds of fork and exec (in the main
thread, where Python delivers it), so the interrupt arrives once the caller holds the child.
`wait_gone` waits until killed processes have left /proc (or are zombies), so "stopped" means
stopped when the caller returns.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import Any


def spawn(argv: Any, **kwargs: Any) -> subprocess.Popen:
    """`subprocess.Popen(argv, **kwargs)` with a Ctrl-C held back until the child is ours.

    The SIGINT handler is swapped (not the signal mask, which the child would inherit) for one
    that only notes the signal; the caller's handler runs once `Popen` has returned."""
    if threading.current_thread() is not threading.main_thread():
        return subprocess.Popen(argv, **kwargs)
    caught: list[tuple[int, Any]] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append((signum, frame)))
    try:
        return subprocess.Popen(argv, **kwargs)
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught and callable(previous):
            previous(*caught[0])
        elif caught and previous == signal.SIG_DFL:
            signal.raise_signal(signal.SIGINT)


def descendants(pid: int) -> list[int]:
    """`pid` and all its live descendant process ids (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode("ascii", "replace")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        if os.path.exists(f"/proc/{p}"):
            out.append(p)
        todo.extend(children.get(p, []))
    return out


def cpu_seconds(pids: list[int]) -> float:
    """The CPU time (user + system, seconds) the processes `pids` have used so far, all their
    threads included; a process that has gone counts 0."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of stat(5)
    return total / tick


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def wait_gone(pids: list[int], timeout: float = 5.0) -> list[int]:
    """Wait until every process of `pids` has exited (a zombie counts as exited); returns those
    still running after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    left = [p for p in pids if _alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = [p for p in left if _alive(p)]
    return left
