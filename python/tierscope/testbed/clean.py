"""Remove everything tierscope left on the machine, and nothing else.

What counts as tierscope's: processes in a `tierscope` cgroup or a `tierscope*` network
namespace, or carrying the TIERSCOPE_MARKER environment variable (the monitor and burners);
network namespaces named `tierscope*`; links whose alias is `tierscope`; cgroup directories
under `/sys/fs/cgroup/<controller>/tierscope`; state files under the state directory; and
PostgreSQL's dynamic shared memory segments (`/dev/shm/PostgreSQL.*`) while no PostgreSQL server
runs on the machine: a server killed with SIGKILL leaves them (a megabyte each), and only a server
started again on the same data directory removes its own, which a lab's never is (its work
directory is gone).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from tierscope.testbed import cgroups, network

MARKER_ENV = b"TIERSCOPE_MARKER="


@dataclass
class Cleaned:
    """What `clean` removed, and what it could not (with the reason)."""

    processes: list[int] = field(default_factory=list)
    netns: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)
    state_files: list[str] = field(default_factory=list)
    segments: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def total(self) -> int:
        return sum(
            len(x) for x in (self.processes, self.netns, self.links, self.cgroups, self.state_files, self.segments)
        )


SHM = Path("/dev/shm")


def postgres_running(proc: Path = Path("/proc")) -> bool:
    """Whether any PostgreSQL server process runs on the machine (by its command name; a zombie
    not reaped yet does not run)."""
    for entry in proc.iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                name, rest = (entry / "stat").read_text().rsplit(")", 1)
                if name.split("(", 1)[1] in ("postgres", "postmaster") and rest.split()[0] != "Z":
                    return True
    return False


def orphan_segments(shm: Path, running: bool, before: float) -> list[Path]:
    """PostgreSQL's dynamic shared memory segments in `shm` that no server can own: none while a
    server runs (`running`); else every `PostgreSQL.<number>` last changed before `before` (a
    server started since the check may have made the newer ones)."""
    if running:
        return []
    out = []
    for seg in shm.glob("PostgreSQL.*"):
        with contextlib.suppress(OSError):
            if seg.suffix[1:].isdigit() and seg.stat().st_mtime < before:
                out.append(seg)
    return sorted(out)


def marked_processes() -> list[int]:
    """Processes carrying tierscope's environment marker (not this one or its ancestors)."""
    mine = {os.getpid()}
    p = os.getppid()
    while p > 1 and p not in mine:
        mine.add(p)
        try:
            with open(f"/proc/{p}/stat", "rb") as f:
                p = int(f.read().rsplit(b")", 1)[1].split()[1])
        except OSError:
            break
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if MARKER_ENV in env and any(v.startswith(MARKER_ENV) for v in env.split(b"\0")):
            out.append(int(entry))
    return out


def _kill(pids: set[int], timeout: float = 5.0) -> list[int]:
    killed = []
    for pid in sorted(pids):
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
                if sig == signal.SIGKILL:
                    killed.append(pid)
            except (ProcessLookupError, PermissionError):
                pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in killed):
        time.sleep(0.05)
    return killed


def leftovers() -> dict[str, list]:
    """What clean would remove, without removing it."""
    groups = [str(p) for p in cgroups.existing()]
    procs: set[int] = set()
    for d in cgroups.existing():
        with contextlib.suppress(OSError):
            procs.update(int(x) for x in (d / "cgroup.procs").read_text().split())
    nss = network.marked_netns()
    for ns in nss:
        procs.update(network.netns_pids(ns))
    procs.update(marked_processes())
    procs.discard(os.getpid())
    return {
        "processes": sorted(procs),
        "netns": nss,
        "links": network.marked_links(),
        "cgroups": groups,
    }


def clean(state_dir: Path | None = None) -> Cleaned:
    """Kill tierscope's processes, then delete its namespaces, links, cgroups and state files."""
    out = Cleaned()
    found = leftovers()
    out.processes = _kill(set(found["processes"]))
    for ns in found["netns"]:
        r = network.ip("netns", "del", ns, check=False)
        (out.netns if r.returncode == 0 else out.errors).append(
            ns if r.returncode == 0 else f"netns {ns}: {r.stderr.strip()}"
        )
    for link in network.marked_links():
        r = network.ip("link", "del", link, check=False)
        if r.returncode == 0:
            out.links.append(link)
        elif network.link_exists(link):
            out.errors.append(f"link {link}: {r.stderr.strip()}")
    for d in cgroups.existing():  # deepest first
        for attempt in range(40):
            try:
                d.rmdir()
                out.cgroups.append(str(d))
                break
            except FileNotFoundError:
                break
            except OSError as err:
                if attempt == 39:
                    out.errors.append(f"cgroup {d}: {err.strerror}")
                time.sleep(0.05)
    checked = time.time()
    for seg in orphan_segments(SHM, postgres_running(), checked - 1.0):
        try:
            seg.unlink()
            out.segments.append(str(seg))
        except FileNotFoundError:
            pass
        except OSError as err:
            out.errors.append(f"segment {seg}: {err.strerror}")
    if state_dir is not None and state_dir.exists():
        import shutil

        for f in sorted(state_dir.glob("lab*")):  # state files and default work dirs
            if f.is_dir():
                shutil.rmtree(f, ignore_errors=True)
            else:
                f.unlink(missing_ok=True)
            out.state_files.append(str(f))
    return out
