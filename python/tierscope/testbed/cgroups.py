"""cgroup v1 groups for hosts: `tierscope/<lab>/<host>` under each controller.

A node type becomes limits: a CPU share as a CFS quota (cpu.cfs_quota_us / cpu.cfs_period_us), or
dedicated CPUs (cpuset.cpus), a memory limit (memory.limit_in_bytes; the OOM killer acts inside the
group), and disk limits (blkio.throttle.{read,write}_{bps,iops}_device on one block device).
Everything tierscope creates lives under the `tierscope` directory of each controller, so
`clean` can find it and touch nothing else.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from pathlib import Path

from tierscope.spec import NodeType

ROOT = Path("/sys/fs/cgroup")
#: the top directory under each controller that holds everything tierscope creates
TOP = "tierscope"
#: controllers every host gets (the monitor reads cpu, cpuacct, memory and blkio)
BASE_CONTROLLERS = ("cpu", "cpuacct", "memory", "blkio")


class CgroupError(RuntimeError):
    """A cgroup could not be created, configured or removed; the message says which file."""


def unavailable_reason() -> str | None:
    """Why namespaced hosts cannot get cgroup limits here (None when they can)."""
    if os.geteuid() != 0:
        return "not running as root (cgroups need root)"
    missing = [c for c in (*BASE_CONTROLLERS, "cpuset") if not (ROOT / c / "cgroup.procs").exists()]
    if missing:
        return (
            f"cgroup v1 controllers not mounted under {ROOT}: {', '.join(missing)} "
            "(this lab needs the v1 cpu, cpuacct, cpuset, memory and blkio controllers)"
        )
    return None


def path(controller: str, rel: str) -> Path:
    return ROOT / controller / rel


def _write(file: Path, value: str) -> None:
    try:
        with open(file, "w") as f:
            f.write(value)
    except OSError as err:
        raise CgroupError(f"cannot write {value!r} to {file}: {err.strerror or err}") from err


def _read(file: Path) -> str:
    with open(file) as f:
        return f.read().strip()


def machine_cpus() -> list[int]:
    """The CPU numbers this machine offers (from the root cpuset)."""
    text = _read(ROOT / "cpuset" / "cpuset.cpus") if (ROOT / "cpuset").exists() else ""
    if not text:
        return list(range(os.cpu_count() or 1))
    return NodeType(cpus=text).cpuset_cpus()


def block_device(spec: str | None, workdir: Path) -> str:
    """The whole-disk `MAJ:MIN` for disk limits: given as "/dev/vda" or "254:0", or the disk of `workdir`."""
    if spec and ":" in spec and not spec.startswith("/"):
        return spec
    if spec:
        try:
            devs = [os.stat(spec).st_rdev]
        except OSError as err:
            raise CgroupError(f"disk limits: disk_device {spec}: {err.strerror or err}") from err
    else:  # the work dir's disk; when that is tmpfs (e.g. /run), the root file system's
        devs = [os.stat(workdir).st_dev, os.stat("/").st_dev]
    for dev in devs:
        majmin = f"{os.major(dev)}:{os.minor(dev)}"
        sysdir = Path("/sys/dev/block") / majmin
        if not sysdir.exists():
            continue
        if (sysdir / "partition").exists():  # throttling applies to the whole disk
            majmin = _read(sysdir.resolve().parent / "dev")
        return majmin
    raise CgroupError(f"disk limits: {spec or workdir} is not on a block device; set disk_device in the node type")


def controllers_for(node_type: NodeType | None) -> tuple[str, ...]:
    if node_type is not None and node_type.cpus:
        return (*BASE_CONTROLLERS, "cpuset")
    return BASE_CONTROLLERS


def _ensure_dir(controller: str, rel: str) -> None:
    """mkdir -p under a controller; cpuset parents get the root's cpus and mems (else tasks can't join)."""
    parts = rel.split("/")
    for i in range(1, len(parts) + 1):
        d = path(controller, "/".join(parts[:i]))
        if not d.exists():
            try:
                d.mkdir()
            except FileExistsError:
                pass
            except OSError as err:
                raise CgroupError(f"cannot create {d}: {err.strerror or err}") from err
        if controller == "cpuset":
            for f in ("cpuset.cpus", "cpuset.mems"):
                if not _read(d / f):
                    _write(d / f, _read(d.parent / f))


def create(rel: str, node_type: NodeType | None, workdir: Path) -> tuple[str, ...]:
    """Create the group `rel` in every controller it needs and apply the node type's limits.

    Returns the controllers the group exists in (what `Host.controllers` must list).
    """
    controllers = controllers_for(node_type)
    for c in controllers:
        _ensure_dir(c, rel)
    nt = node_type or NodeType()
    period_us = int(round(nt.cpu_period * 1e6))
    _write(path("cpu", rel) / "cpu.cfs_period_us", str(period_us))
    quota = int(round(nt.cpu * period_us)) if nt.cpu is not None else -1
    _write(path("cpu", rel) / "cpu.cfs_quota_us", str(quota))
    if nt.cpus:
        have = set(machine_cpus())
        want = nt.cpuset_cpus()
        if not set(want) <= have:
            raise CgroupError(
                f"node type asks for CPUs {nt.cpus} but this machine has CPUs {','.join(map(str, sorted(have)))}"
            )
        _write(path("cpuset", rel) / "cpuset.cpus", nt.cpus)
    mem = path("memory", rel)
    _write(mem / "memory.limit_in_bytes", str(nt.memory) if nt.memory else "-1")
    disk = {
        "blkio.throttle.read_bps_device": nt.disk_read_bps,
        "blkio.throttle.write_bps_device": nt.disk_write_bps,
        "blkio.throttle.read_iops_device": nt.read_iops_limit(),
        "blkio.throttle.write_iops_device": nt.disk_write_iops,
    }
    if any(v for v in disk.values()):
        dev = block_device(nt.disk_device, workdir)
        for f, v in disk.items():
            if v:
                _write(path("blkio", rel) / f, f"{dev} {int(v)}")
    return controllers


def procs(rel: str, controller: str = "cpuacct") -> list[int]:
    """Process ids in the group (and its sub-groups)."""
    out: list[int] = []
    base = path(controller, rel)
    if not base.exists():
        return out
    for d, _dirs, _files in os.walk(base):
        try:
            out.extend(int(x) for x in _read(Path(d) / "cgroup.procs").split())
        except OSError:
            continue
    return out


def kill_procs(rel: str, controllers: tuple[str, ...] = BASE_CONTROLLERS, timeout: float = 5.0) -> int:
    """SIGKILL every process of the group (SIGCONT first, in case it was paused); wait until gone."""
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    while True:
        pids = set()
        for c in controllers:
            pids.update(procs(rel, c))
        pids.discard(os.getpid())
        if not pids:
            return len(seen)
        for pid in pids:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        seen |= pids
        if time.monotonic() > deadline:
            raise CgroupError(f"processes {sorted(pids)} in cgroup {rel} would not die")
        time.sleep(0.05)


def remove(rel: str, controllers: tuple[str, ...] = (*BASE_CONTROLLERS, "cpuset"), timeout: float = 5.0) -> None:
    """Kill the group's processes and remove it (sub-groups first) from every controller."""
    kill_procs(rel, controllers, timeout)
    for c in controllers:
        base = path(c, rel)
        if not base.exists():
            continue
        dirs = sorted((Path(d) for d, _, _ in os.walk(base)), key=lambda p: len(p.parts), reverse=True)
        for d in dirs:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as err:
                    if err.errno != errno.EBUSY or time.monotonic() > deadline:
                        raise CgroupError(f"cannot remove {d}: {err.strerror or err}") from err
                    time.sleep(0.05)


def remove_if_empty(rel: str) -> None:
    """Remove a parent group (e.g. tierscope/0) from every controller when nothing is left in it."""
    for c in (*BASE_CONTROLLERS, "cpuset"):
        d = path(c, rel)
        try:
            if d.exists() and not any(p.is_dir() for p in d.iterdir()) and not _read(d / "cgroup.procs"):
                d.rmdir()
        except OSError:
            pass


def existing(controller_root: Path = ROOT) -> list[Path]:
    """Every tierscope group directory under any controller (deepest first)."""
    out: list[Path] = []
    for c in sorted(controller_root.iterdir()) if controller_root.exists() else []:
        top = c / TOP
        if c.is_dir() and not c.is_symlink() and top.is_dir():
            out.extend(Path(d) for d, _, _ in os.walk(top))
    return sorted(out, key=lambda p: len(p.parts), reverse=True)
